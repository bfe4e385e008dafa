//! Similar-function merging: functions that differ only in the values of a
//! few integer or float constants share one parameterized body, and each
//! becomes a thunk that passes its own values.
//!
//! Not wired into [`crate::DedupModule`]: this module finds the groups,
//! derives their parameters, decides with a cost model in machine-code
//! bytes which groups pay, and builds the merged body and the thunks as
//! CLIF. `jitfold report --similar` runs it on a corpus.
//!
//! # What this module guarantees
//!
//! 1. **Shapes.** [`Shaper::shape`] gives a function's [`Shape`]: its exact
//!    key ([`crate::Fingerprint`]) with the words of each *parameterizable*
//!    constant's immediate (below) set to zero, followed by the count and
//!    the key positions of the immediates masked. Two functions have equal
//!    shapes exactly when their exact keys are equal but for the
//!    immediates of those constants, which are then at the same positions,
//!    of the same opcodes and types, with the same uses. The exact key and
//!    the template key are not changed (nor
//!    [`KEY_FORMAT_VERSION`](crate::fingerprint::KEY_FORMAT_VERSION)):
//!    the walk only records where each constant's immediate is
//!    ([`Walk::constant_sites`]). Names stay in the shape: members call
//!    the same functions and name the same symbols, so members that call
//!    themselves (each by its own name) never share a shape, which keeps
//!    a body from calling the first member where another called itself.
//! 2. **Parameters.** [`derive()`] numbers the sites of a group LLVM-style: a
//!    site whose value is equal in every member stays a constant; sites
//!    with equal value vectors (and types) share one parameter.
//! 3. **Meaning.** [`merged_body`] is the group's first member with each
//!    parameterized constant replaced by a new parameter appended to the
//!    signature (the constant's result becomes an alias of it), so the body
//!    called with member `m`'s values computes exactly what `m` computes:
//!    the members differ in nothing else (1), and every use of a
//!    parameterized value is an operand whose meaning does not depend on
//!    whether it is a constant (below). [`thunk`] has the member's own
//!    signature and passes its arguments and values through.
//! 4. **Cost.** [`CostModel::predict`] counts, in bytes of machine code, the
//!    members' code removed against the thunks and the body's growth;
//!    [`plan_group`] merges only groups that it predicts to pay and whose
//!    parameters fit [`SimilarOptions::max_params`].
//!
//! # What it costs
//!
//! The walk records one word position per constant (within the noise of
//! `jitfold report`'s `fingerprint_ns_per_inst` on the wasm corpora: the
//! least noisy, resvg, measured 31.2 before and 32.1 ns per instruction
//! after, best of seven). Shaping a walked function (the use scan, the
//! masked copy of the key and its hash) costs about as much again as the
//! walk, 45-65 ns per instruction, and is done only when asked for.
//!
//! # What is parameterizable
//!
//! Audited in Cranelift 0.135.8 (`cranelift-codegen` `src/`). Every CLIF
//! operand is a value, so any operand is *correct* with a parameter in
//! place of a constant: Cranelift's mid-end and lowering fold constants
//! into immediates and strength-reduce them, but only where the result is
//! the same (float folds, for one, only fold results that are not NaN,
//! "what the instruction would have at run-time", `opts/cprop.isle` from
//! line 392). What a parameter changes is the code, not its meaning:
//! `iadd x, iconst` lowers to `add r, imm32` (`isa/x64/lower.isle`, the
//! `simm32_from_value` rules, e.g. `band` at line 341, `bor` at 467, `bxor`
//! at 538), and with a parameter to `add r, r`. So the rule is chosen to
//! keep the body's growth small and the audit short, not for correctness
//! alone. An `iconst`, `f32const` or `f64const` is a parameter site when
//! it is reachable, has at least one use, and **every** use (in any block
//! of the layout, through value aliases) is one of:
//!
//! - an operand of `iadd`, `isub`, `imul`, `band`, `bor`, `bxor`, `smin`,
//!   `smax`, `umin`, `umax`,
//!   `ineg`, `iabs`, `bnot`, `uextend`, `sextend`, `ireduce`, `splat`, or
//!   `icmp` (the condition code is an immediate and stays in the key);
//! - an operand of `fadd`, `fsub`, `fmul`, `fdiv`, `fmin`, `fmax`, `fneg`,
//!   `fabs`, `fcopysign`, `fma`, `fcmp`, `fpromote`, `fdemote`, `bitcast`
//!   (a float constant by its raw bits: NaN payloads and `-0.0` are
//!   passed as they are);
//! - the second or third operand of `select` (a selected value, not the
//!   condition);
//! - the stored value (first operand) of `store`, `istore8`, `istore16`,
//!   `istore32` (not the address);
//! - an argument of `call`, `return_call` or `return`, or a non-callee
//!   argument of `call_indirect` and `return_call_indirect`;
//! - a block argument of `jump` or `brif`.
//!
//! Not parameterizable (any such use keeps the constant in the shape):
//!
//! - addresses of memory accesses and atomics (address-mode folding,
//!   `amode` rules in `isa/x64/lower.isle`), callees of indirect calls;
//! - shift and rotate amounts: lowered with the amount masked to the type
//!   width as an immediate (`shift_amount_masked`, `isa/x64/lower.isle`
//!   line 794) and with an extra `and` otherwise (line 792);
//! - divisors and remainders: a constant divisor is strength-reduced to a
//!   multiply (`opts/arithmetic.isle`) and cannot trap, a register divisor
//!   gets a division and a zero check (`udiv` at `isa/x64/lower.isle` line
//!   4432): same meaning, much more code;
//! - branch conditions (`brif`), `br_table` indices and arguments, trap
//!   conditions, `try_call` arguments and exception-table contexts: they
//!   decide control flow and the mid-end folds them;
//! - everything that is an immediate in CLIF rather than a value: memory
//!   offsets (`Offset32`), lane indices (`Uimm8`), shuffle masks
//!   (`dfg.immediates`), condition and trap codes, stack slot sizes,
//!   types, `br_table` contents, exception tables. These are in the key and
//!   never masked.
//! - `f16const`, `f128const` and vector constants, callees and symbols
//!   (later work: the full list), and any use not listed above.
//!
//! Whole functions are left out when a thunk in front of them could be
//! observed ([`Walk::observes_own_frame`]: frame or return address reads,
//! stack switches, exception catching), when their calling convention is
//! not one that takes appended parameters plainly (`fast`, `tail`,
//! `system_v`, `windows_fastcall`, `apple_aarch64`), or when a parameter
//! has a special purpose other than `vmctx` (struct arguments and returns).

use crate::fingerprint::{Shape, Walk};
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{
    AbiParam, ArgumentPurpose, ExceptionTableItem, ExtFuncData, ExternalName, Function, Inst,
    InstBuilder, Opcode, Signature, Type, UserExternalName, UserFuncName, Value,
    immediates::{Ieee32, Ieee64},
    types,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use hashbrown::HashMap;

/// What kind of constant a parameter replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// An `iconst`.
    Int,
    /// An `f32const` or `f64const` (by its raw bits: NaN payloads and
    /// `-0.0` are values of their own).
    Float,
}

/// The value of one parameter site of one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamValue {
    /// What the site is.
    pub kind: ParamKind,
    /// Its type (the constant's controlling type).
    pub ty: Type,
    /// Its raw immediate bits, as stored in the instruction (an `f32const`'s
    /// zero-extended).
    pub bits: i64,
}

/// A function's shape and its parameter sites.
#[derive(Clone, Debug)]
pub struct ShapeOf {
    /// The shape (see the [module docs](self)).
    pub shape: Shape,
    /// The constant instruction of each site, in walk order.
    pub sites: Vec<Inst>,
    /// The value of each site, in walk order.
    pub values: Vec<ParamValue>,
}

const NO_SITE: u32 = u32::MAX;

/// How the uses of a site seen so far qualify it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SiteUse {
    Unused,
    Ordinary,
    Excluded,
}

/// Computes shapes, reusing its scratch memory across functions.
pub struct Shaper {
    site_of: SecondaryMap<Value, u32>,
    uses: Vec<SiteUse>,
    words: Vec<u32>,
}

impl Default for Shaper {
    fn default() -> Self {
        Self::new()
    }
}

impl Shaper {
    /// A shaper with empty scratch memory.
    pub fn new() -> Self {
        Self {
            site_of: SecondaryMap::with_default(NO_SITE),
            uses: Vec::new(),
            words: Vec::new(),
        }
    }

    /// The shape of `func`, from `walk`, the walk of `func`.
    pub fn shape(&mut self, walk: &Walk<'_>, func: &Function) -> ShapeOf {
        let dfg = &func.dfg;
        let candidates = walk.constant_sites();
        self.uses.clear();
        self.uses.resize(candidates.len(), SiteUse::Unused);
        self.site_of.clear();
        for (i, site) in candidates.iter().enumerate() {
            if let Some(&result) = dfg.inst_results(site.inst).first() {
                self.site_of[result] = i as u32;
            }
        }
        if !candidates.is_empty() {
            for block in func.layout.blocks() {
                for inst in func.layout.block_insts(block) {
                    self.uses_of(func, inst);
                }
            }
        }
        let key = walk.key().key();
        self.words.clear();
        self.words.extend_from_slice(key);
        let mut masked = Vec::new();
        let mut sites = Vec::new();
        let mut values = Vec::new();
        for (site, &used) in candidates.iter().zip(&self.uses) {
            let w = site.word as usize;
            let Some((kind, width)) = constant_kind(dfg.insts[site.inst].opcode()) else {
                continue;
            };
            if used != SiteUse::Ordinary || w + width > key.len() {
                continue;
            }
            let Some(&result) = dfg.inst_results(site.inst).first() else {
                continue;
            };
            let high = if width == 2 { u64::from(key[w + 1]) } else { 0 };
            let bits = (u64::from(key[w]) | high << 32) as i64;
            self.words[w..w + width].fill(0);
            masked.push(site.word);
            sites.push(site.inst);
            values.push(ParamValue {
                kind,
                ty: dfg.value_type(result),
                bits,
            });
        }
        self.words.push(masked.len() as u32);
        self.words.extend_from_slice(&masked);
        ShapeOf {
            shape: Shape::of_words(self.words.clone(), walk.instructions()),
            sites,
            values,
        }
    }

    /// Qualifies the sites `inst` uses.
    fn uses_of(&mut self, func: &Function, inst: Inst) {
        let dfg = &func.dfg;
        let data = &dfg.insts[inst];
        let opcode = data.opcode();
        for (index, &arg) in dfg.inst_args(inst).iter().enumerate() {
            self.use_of(func, arg, ordinary_operand(opcode, index));
        }
        if !opcode.is_branch() {
            return;
        }
        let block_args_ordinary = matches!(opcode, Opcode::Jump | Opcode::Brif);
        for call in data.branch_destination(&dfg.jump_tables, &dfg.exception_tables) {
            for arg in call.args(&dfg.value_lists) {
                if let Some(v) = arg.as_value() {
                    self.use_of(func, v, block_args_ordinary);
                }
            }
        }
        if let Some(et) = data.exception_table()
            && let Some(table) = dfg.exception_tables.get(et)
        {
            for item in table.items() {
                if let ExceptionTableItem::Context(v) = item {
                    self.use_of(func, v, false);
                }
            }
        }
    }

    #[inline]
    fn use_of(&mut self, func: &Function, v: Value, ordinary: bool) {
        let mut site = self.site_of[v];
        if site == NO_SITE {
            // An alias of a site's value, or no site.
            if !func.dfg.value_is_valid(v) {
                return;
            }
            site = self.site_of[func.dfg.resolve_aliases(v)];
        }
        if site == NO_SITE {
            return;
        }
        let used = &mut self.uses[site as usize];
        *used = match (*used, ordinary) {
            (SiteUse::Excluded, _) | (_, false) => SiteUse::Excluded,
            _ => SiteUse::Ordinary,
        };
    }
}

/// The kind of constant an instruction of `opcode` is, and how many key
/// words its immediate takes; `None` if it is not a constant site.
fn constant_kind(opcode: Opcode) -> Option<(ParamKind, usize)> {
    match opcode {
        Opcode::Iconst => Some((ParamKind::Int, 2)),
        Opcode::F64const => Some((ParamKind::Float, 2)),
        Opcode::F32const => Some((ParamKind::Float, 1)),
        _ => None,
    }
}

/// Whether operand `index` of an instruction with `opcode` is an ordinary
/// use (see the [module docs](self)).
fn ordinary_operand(opcode: Opcode, index: usize) -> bool {
    match opcode {
        Opcode::Iadd
        | Opcode::Isub
        | Opcode::Imul
        | Opcode::Band
        | Opcode::Bor
        | Opcode::Bxor
        | Opcode::Smin
        | Opcode::Smax
        | Opcode::Umin
        | Opcode::Umax
        | Opcode::Ineg
        | Opcode::Iabs
        | Opcode::Bnot
        | Opcode::Uextend
        | Opcode::Sextend
        | Opcode::Ireduce
        | Opcode::Splat
        | Opcode::Icmp
        | Opcode::Fadd
        | Opcode::Fsub
        | Opcode::Fmul
        | Opcode::Fdiv
        | Opcode::Fmin
        | Opcode::Fmax
        | Opcode::Fneg
        | Opcode::Fabs
        | Opcode::Fcopysign
        | Opcode::Fma
        | Opcode::Fcmp
        | Opcode::Fpromote
        | Opcode::Fdemote
        | Opcode::Bitcast
        | Opcode::Call
        | Opcode::ReturnCall
        | Opcode::Return => true,
        Opcode::Select => index >= 1,
        Opcode::Store | Opcode::Istore8 | Opcode::Istore16 | Opcode::Istore32 => index == 0,
        Opcode::CallIndirect | Opcode::ReturnCallIndirect => index >= 1,
        _ => false,
    }
}

/// Whether a thunk may stand in front of `func` and its body take appended
/// parameters (see the [module docs](self)); `observes_own_frame` is the
/// walk's [`Walk::observes_own_frame`].
pub fn mergeable(func: &Function, observes_own_frame: bool) -> bool {
    let sig = &func.signature;
    !observes_own_frame
        && matches!(
            sig.call_conv,
            CallConv::Fast
                | CallConv::Tail
                | CallConv::SystemV
                | CallConv::WindowsFastcall
                | CallConv::AppleAarch64
        )
        && sig.params.iter().chain(&sig.returns).all(|p| {
            matches!(
                p.purpose,
                ArgumentPurpose::Normal | ArgumentPurpose::VMContext
            )
        })
}

/// One parameter of a merged body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Its type.
    pub ty: Type,
    /// Its value in each member, in member order.
    pub values: Vec<i64>,
}

/// The parameters of a group (see [`derive()`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// The body's appended parameters, in order.
    pub params: Vec<Param>,
    /// For each site: the parameter it becomes, or `None` when its value
    /// is equal in every member (it stays a constant).
    pub site_param: Vec<Option<usize>>,
}

/// The parameters of a group whose members (all of one shape) have the
/// site values `members`: one per distinct vector of values across the
/// members (with its type), in site order; sites equal in every member
/// stay constants. `None` if the members do not have the same sites (they
/// are not of one shape).
pub fn derive(members: &[&[ParamValue]]) -> Option<Derived> {
    let first = members.first()?;
    let sites = first.len();
    let agree = members.iter().all(|m| {
        m.len() == sites
            && m.iter()
                .zip(first.iter())
                .all(|(a, b)| a.kind == b.kind && a.ty == b.ty)
    });
    if !agree {
        return None;
    }
    let mut params: Vec<Param> = Vec::new();
    let mut by_values: HashMap<(Type, Vec<i64>), usize> = HashMap::new();
    let mut site_param = Vec::with_capacity(sites);
    for (i, site) in first.iter().enumerate() {
        let values: Vec<i64> = members.iter().map(|m| m[i].bits).collect();
        if values.iter().all(|&v| v == site.bits) {
            site_param.push(None);
            continue;
        }
        let p = *by_values
            .entry((site.ty, values.clone()))
            .or_insert_with(|| {
                params.push(Param {
                    ty: site.ty,
                    values,
                });
                params.len() - 1
            });
        site_param.push(Some(p));
    }
    Some(Derived { params, site_param })
}

/// A cost model in bytes of machine code (see [`CostModel::predict`]).
///
/// Function alignment padding is not counted (as in the rest of
/// `jitfold report`, which counts the bytes Cranelift emits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostModel {
    /// A thunk with no parameters and no stack arguments: its frame, the
    /// call or jump, and the return.
    pub thunk_bytes: u64,
    /// Each parameter a thunk materializes.
    pub thunk_bytes_per_param: u64,
    /// A thunk with stack arguments: the fixed part (a larger frame or the
    /// tail call's argument area).
    pub thunk_stack_bytes: u64,
    /// Each stack argument of a thunk's call.
    pub thunk_bytes_per_stack_arg: u64,
    /// What each parameter adds to the body in a register (an operand in a
    /// register rather than an immediate).
    pub body_bytes_per_param: u64,
    /// What each parameter adds to the body when it arrives on the stack.
    pub body_bytes_per_stack_param: u64,
    /// Integer (and pointer) arguments passed in registers.
    pub int_arg_registers: usize,
    /// Float and vector arguments passed in registers.
    pub float_arg_registers: usize,
    /// An estimate of a function's code size per instruction, for when the
    /// members were not compiled.
    pub bytes_per_instruction: u64,
}

impl CostModel {
    /// x86-64 (`system_v` and `tail`: six integer and eight float
    /// argument registers), fitted to the bodies and thunks Cranelift
    /// 0.135.8 emits for the shared wasm corpora (`jitfold report
    /// --similar --compile --groups --json`): a thunk is 13 bytes plus 6
    /// per parameter while every argument is in a register (measured:
    /// 18-19 bytes with one parameter, 24-25 with two), and about 20 more
    /// plus 6 per stack argument otherwise (47-74 bytes with one to three
    /// stack arguments); a body grows by about 5 bytes per parameter in a
    /// register and 20 per parameter on the stack.
    pub const X86_64: CostModel = CostModel {
        thunk_bytes: 13,
        thunk_bytes_per_param: 6,
        thunk_stack_bytes: 20,
        thunk_bytes_per_stack_arg: 6,
        body_bytes_per_param: 5,
        body_bytes_per_stack_param: 20,
        int_arg_registers: 6,
        float_arg_registers: 8,
        bytes_per_instruction: 4,
    };

    /// The prediction for a group of members with signature `sig` whose
    /// code sizes are `member_bytes` (the first one's code becomes the
    /// body), merged with parameters of types `params`: the bytes removed
    /// are every member's code but the first's; the bytes added are one
    /// thunk per member (materializing the parameters, passing its
    /// arguments) and the body's growth.
    pub fn predict(&self, sig: &Signature, member_bytes: &[u64], params: &[Type]) -> Prediction {
        let n = member_bytes.len() as u64;
        let removed = member_bytes.iter().skip(1).sum();
        let own = sig.params.iter().map(|p| p.value_type);
        let before = self.stack_args(own.clone());
        let after = self.stack_args(own.chain(params.iter().copied()));
        let k = params.len() as u64;
        let stack_params = after.saturating_sub(before) as u64;
        let mut thunk = self.thunk_bytes + k * self.thunk_bytes_per_param;
        if after > 0 {
            thunk += self.thunk_stack_bytes + after as u64 * self.thunk_bytes_per_stack_arg;
        }
        let body = (k - stack_params.min(k)) * self.body_bytes_per_param
            + stack_params * self.body_bytes_per_stack_param;
        Prediction {
            removed,
            added: n * thunk + body,
        }
    }

    /// How many of arguments of types `types` go on the stack.
    fn stack_args(&self, types: impl Iterator<Item = Type>) -> usize {
        let (mut ints, mut floats) = (0usize, 0usize);
        for ty in types {
            if ty.is_float() || ty.is_vector() {
                floats += 1;
            } else {
                ints += if ty.bits() > 64 { 2 } else { 1 };
            }
        }
        ints.saturating_sub(self.int_arg_registers)
            + floats.saturating_sub(self.float_arg_registers)
    }
}

impl Default for CostModel {
    fn default() -> Self {
        Self::X86_64
    }
}

/// What merging a group is predicted to remove and add, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prediction {
    /// Bytes of code removed.
    pub removed: u64,
    /// Bytes of code added.
    pub added: u64,
}

impl Prediction {
    /// Bytes saved (negative: lost).
    pub fn saved(&self) -> i64 {
        self.removed as i64 - self.added as i64
    }

    /// Whether merging pays: it saves at least one byte.
    pub fn pays(&self) -> bool {
        self.removed > self.added
    }
}

/// Limits of similar-function merging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimilarOptions {
    /// At most this many parameters per body.
    pub max_params: usize,
    /// The cost model.
    pub model: CostModel,
}

impl Default for SimilarOptions {
    fn default() -> Self {
        Self {
            max_params: 6,
            model: CostModel::default(),
        }
    }
}

/// What [`plan_group`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Merge: one body, a thunk per member.
    Merge,
    /// Left alone: more parameters than [`SimilarOptions::max_params`].
    TooManyParams,
    /// Left alone: the cost model predicts no saving.
    DoesNotPay,
}

/// The plan of one group of one shape.
#[derive(Clone, Debug)]
pub struct GroupPlan {
    /// Its parameters.
    pub derived: Derived,
    /// The cost model's prediction.
    pub prediction: Prediction,
    /// What to do.
    pub decision: Decision,
}

/// Plans a group whose members (two or more, all of one shape, mergeable,
/// with signature `sig`) have the site values `members` and code sizes
/// `member_bytes`; `None` if they are not of one shape.
pub fn plan_group(
    sig: &Signature,
    members: &[&[ParamValue]],
    member_bytes: &[u64],
    options: &SimilarOptions,
) -> Option<GroupPlan> {
    let derived = derive(members)?;
    let types: Vec<Type> = derived.params.iter().map(|p| p.ty).collect();
    let prediction = options.model.predict(sig, member_bytes, &types);
    let decision = if derived.params.len() > options.max_params {
        Decision::TooManyParams
    } else if !prediction.pays() {
        Decision::DoesNotPay
    } else {
        Decision::Merge
    };
    Some(GroupPlan {
        derived,
        prediction,
        decision,
    })
}

/// Splits a group of one shape (site values `members`, in member order)
/// into subgroups whose parameters fit `max_params`: each member joins the
/// first subgroup it fits in, or starts one. (Swift's merger drops the most
/// divergent member and retries; this keeps every member that fits with
/// some other.) Returns member indices; a subgroup of one is a member left
/// alone.
pub fn split(members: &[&[ParamValue]], max_params: usize) -> Vec<Vec<usize>> {
    let mut subgroups: Vec<Vec<usize>> = Vec::new();
    let mut trial: Vec<&[ParamValue]> = Vec::new();
    'member: for (i, &m) in members.iter().enumerate() {
        for g in &mut subgroups {
            trial.clear();
            trial.extend(g.iter().map(|&j| members[j]));
            trial.push(m);
            if derive(&trial).is_some_and(|d| d.params.len() <= max_params) {
                g.push(i);
                continue 'member;
            }
        }
        subgroups.push(vec![i]);
    }
    subgroups
}

/// The merged body of a group: `first` (the group's first member, whose
/// parameter sites are `sites`, as [`ShapeOf::sites`]) with each site that
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
    if sig.call_conv == CallConv::Tail && body_sig.call_conv == CallConv::Tail {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fingerprinter;
    use cranelift_codegen::{ir, settings};

    fn parse(text: &str) -> Function {
        cranelift_reader::parse_functions(text)
            .expect("parses")
            .remove(0)
    }

    fn shape(text: &str) -> (Function, ShapeOf, crate::Fingerprint) {
        let func = parse(text);
        let mut walker = Fingerprinter::new();
        let walk = walker.walk(&func);
        let fp = walk.fingerprint();
        let shape = Shaper::new().shape(&walk, &func);
        (func, shape, fp)
    }

    /// `op` applied to `v0` and a constant `c`, returned.
    fn with_constant(op: &str, c: i64) -> String {
        format!(
            "function %f(i64) -> i64 system_v {{
             block0(v0: i64):
                 v1 = iconst.i64 {c}
                 v2 = {op} v0, v1
                 return v2
             }}"
        )
    }

    #[test]
    fn ordinary_constants_are_masked_and_listed() {
        let (_, a, fa) = shape(&with_constant("iadd", 7));
        let (_, b, fb) = shape(&with_constant("iadd", -3));
        assert_ne!(fa, fb, "the exact keys still differ");
        assert_eq!(a.shape, b.shape);
        assert_eq!(a.values.len(), 1);
        assert_eq!(a.values[0].bits, 7);
        assert_eq!(b.values[0].bits, -3);
        assert_eq!(a.values[0].ty, ir::types::I64);
    }

    #[test]
    fn constants_used_as_shift_amounts_or_divisors_stay_in_the_shape() {
        for op in ["ishl", "udiv", "sdiv", "rotl"] {
            let (_, a, _) = shape(&with_constant(op, 3));
            let (_, b, _) = shape(&with_constant(op, 5));
            assert!(a.values.is_empty(), "{op}");
            assert_ne!(a.shape, b.shape, "{op}");
        }
    }

    #[test]
    fn one_excluded_use_excludes_the_constant() {
        let text = |c: i64| {
            format!(
                "function %f(i64) -> i64 system_v {{
                 block0(v0: i64):
                     v1 = iconst.i64 {c}
                     v2 = iadd v0, v1
                     v3 = load.i64 v1
                     v4 = iadd v2, v3
                     return v4
                 }}"
            )
        };
        let (_, a, _) = shape(&text(16));
        let (_, b, _) = shape(&text(32));
        assert!(a.values.is_empty());
        assert_ne!(a.shape, b.shape);
    }

    #[test]
    fn the_shape_lists_the_positions_it_masked() {
        // Masked words are zero, as a constant 0 is: the list of masked
        // positions after the key keeps a masked constant apart from a
        // constant 0 that stays.
        let (_, a, fa) = shape(&with_constant("iadd", 5));
        let key = a.shape.key();
        assert_eq!(key.len(), fa.key().len() + 2);
        let position = key[key.len() - 1] as usize;
        assert_eq!(key[key.len() - 2], 1);
        assert_eq!(fa.key()[position], 5);
        assert_eq!(key[position], 0);
        let (_, z, _) = shape(&with_constant("iadd", 0));
        assert_eq!(a.shape, z.shape);
    }

    #[test]
    fn derive_keeps_equal_sites_and_shares_equal_vectors() {
        let v = |bits: i64| ParamValue {
            kind: ParamKind::Int,
            ty: ir::types::I32,
            bits,
        };
        let a = [v(1), v(5), v(9), v(5)];
        let b = [v(1), v(6), v(8), v(6)];
        let c = [v(1), v(7), v(8), v(7)];
        let d = derive(&[&a, &b, &c]).unwrap();
        assert_eq!(d.site_param, vec![None, Some(0), Some(1), Some(0)]);
        assert_eq!(d.params[0].values, vec![5, 6, 7]);
        assert_eq!(d.params[1].values, vec![9, 8, 8]);
        assert!(derive(&[&a[..], &a[..3]]).is_none());
    }

    #[test]
    fn split_keeps_subgroups_within_the_parameter_limit() {
        let v = |bits: i64| ParamValue {
            kind: ParamKind::Int,
            ty: ir::types::I64,
            bits,
        };
        // a and c differ in one site, b from both in three.
        let a = [v(1), v(2), v(3)];
        let b = [v(7), v(8), v(9)];
        let c = [v(1), v(2), v(4)];
        assert_eq!(split(&[&a, &b, &c], 1), vec![vec![0, 2], vec![1]]);
        assert_eq!(split(&[&a, &b, &c], 3), vec![vec![0, 1, 2]]);
        assert_eq!(split(&[&a, &b, &c], 0), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn the_cost_model_refuses_small_groups_and_too_many_parameters() {
        let options = SimilarOptions::default();
        let v = |bits: i64| ParamValue {
            kind: ParamKind::Int,
            ty: ir::types::I64,
            bits,
        };
        let (a, b) = ([v(1)], [v(2)]);
        let sig = Signature::new(CallConv::SystemV);
        let small = plan_group(&sig, &[&a, &b], &[20, 20], &options).unwrap();
        assert_eq!(small.decision, Decision::DoesNotPay);
        let large = plan_group(&sig, &[&a, &b], &[400, 400], &options).unwrap();
        assert_eq!(large.decision, Decision::Merge);
        assert_eq!(large.prediction.removed, 400);
        // Two thunks of 13 + 6 bytes, and 5 bytes of growth.
        assert_eq!(large.prediction.added, 43);
        let many_a: Vec<ParamValue> = (0..8).map(v).collect();
        let many_b: Vec<ParamValue> = (10..18).map(v).collect();
        let many = plan_group(&sig, &[&many_a, &many_b], &[4000, 4000], &options).unwrap();
        assert_eq!(many.decision, Decision::TooManyParams);
    }

    #[test]
    fn the_merged_body_takes_the_constants_as_parameters_and_verifies() {
        let text = |c: i64, d: i64| {
            format!(
                "function %f(i64) -> i64 system_v {{
                 block0(v0: i64):
                     v1 = iconst.i64 {c}
                     v2 = iconst.i32 {d}
                     v3 = iadd v0, v1
                     v4 = sextend.i64 v2
                     v5 = imul v3, v4
                     return v5
                 }}"
            )
        };
        let (f, a, _) = shape(&text(3, 4));
        let (_, b, _) = shape(&text(3, 9));
        assert_eq!(a.shape, b.shape);
        let d = derive(&[&a.values, &b.values]).unwrap();
        assert_eq!(d.site_param, vec![None, Some(0)]);
        let body = merged_body(&f, &a.sites, &d).unwrap();
        assert_eq!(body.signature.params.len(), 2);
        assert_eq!(body.signature.params[1].value_type, ir::types::I32);
        let flags = settings::Flags::new(settings::builder());
        cranelift_codegen::verify_function(&body, &flags).unwrap();
        let printed = body.display().to_string();
        assert!(printed.contains("iconst.i64 3"), "{printed}");
        assert!(!printed.contains("iconst.i32"), "{printed}");
        let t = thunk(
            cranelift_codegen::isa::TargetFrontendConfig {
                default_call_conv: CallConv::SystemV,
                pointer_width: target_lexicon::PointerWidth::U64,
                page_size_align_log2: 12,
            },
            UserFuncName::user(0, 1),
            &f.signature,
            UserExternalName::new(0, 2),
            &body.signature,
            &thunk_values(&d, 1),
        );
        cranelift_codegen::verify_function(&t, &flags).unwrap();
        assert!(t.display().to_string().contains("iconst.i32 9"));
    }
}
