//! Groups of one shape: parameters derived from the members' values, the
//! byte cost model, and splitting groups that need too many parameters
//! (see the [module docs](super)).

use super::shape::{ParamKind, ParamValue, SiteValue};
use super::size::Lowered;
use cranelift_codegen::ir::{AbiParam, ArgumentPurpose, Signature, Type, types};
use cranelift_codegen::isa::CallConv;
use hashbrown::HashMap;
use target_lexicon::Architecture;

/// One parameter of a merged body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// What it replaces.
    pub kind: ParamKind,
    /// Its type.
    pub ty: Type,
    /// Its value in each member, in member order.
    pub values: Vec<SiteValue>,
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
    let mut by_values: HashMap<(ParamKind, Type, Vec<SiteValue>), usize> = HashMap::new();
    let mut site_param = Vec::with_capacity(sites);
    for (i, site) in first.iter().enumerate() {
        let values: Vec<SiteValue> = members.iter().map(|m| m[i].value.clone()).collect();
        if values.iter().all(|v| *v == site.value) {
            site_param.push(None);
            continue;
        }
        let p = *by_values
            .entry((site.kind, site.ty, values.clone()))
            .or_insert_with(|| {
                params.push(Param {
                    kind: site.kind,
                    ty: site.ty,
                    values,
                });
                params.len() - 1
            });
        site_param.push(Some(p));
    }
    Some(Derived { params, site_param })
}

/// The values a thunk of a function with site values `member` passes to a
/// body with parameters `derived`, built from a function with site values
/// `built_from` (of the same shape): each parameter's value in `member`.
/// `None` if the body does not fit `member`: a site that stays a constant
/// has another value in `member`, or sites that share a parameter have
/// different values in it.
pub fn values_for(
    derived: &Derived,
    built_from: &[ParamValue],
    member: &[ParamValue],
) -> Option<Vec<(Type, SiteValue)>> {
    if member.len() != derived.site_param.len() || built_from.len() != member.len() {
        return None;
    }
    let mut values: Vec<Option<&SiteValue>> = vec![None; derived.params.len()];
    for ((site, param), kept) in member.iter().zip(&derived.site_param).zip(built_from) {
        if site.kind != kept.kind || site.ty != kept.ty {
            return None;
        }
        match *param {
            None if site.value != kept.value => return None,
            None => {}
            Some(p) => match values[p] {
                None => values[p] = Some(&site.value),
                Some(v) if *v != site.value => return None,
                Some(_) => {}
            },
        }
    }
    let params = derived.params.iter().zip(values);
    params.map(|(p, v)| Some((p.ty, v?.clone()))).collect()
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
    /// A check of a stack limit: a thunk's of its member's limit (where
    /// the members have one and the thunk checks it: not with
    /// [`thunk_skips_stack_check`]), and a member's own
    /// ([`CostModel::function_bytes`]).
    pub thunk_stack_check_bytes: u64,
    /// What each parameter adds to the body in a register (an operand in a
    /// register rather than an immediate).
    pub body_bytes_per_param: u64,
    /// What each parameter adds to the body when it arrives on the stack.
    pub body_bytes_per_stack_param: u64,
    /// Integer (and pointer) arguments passed in registers.
    pub int_arg_registers: usize,
    /// Float and vector arguments passed in registers.
    pub float_arg_registers: usize,
    /// An estimate of a function's code size per instruction Cranelift
    /// lowers ([`live_instructions`](super::live_instructions)): members
    /// are planned before they are compiled
    /// ([`CostModel::function_bytes`]).
    pub bytes_per_instruction: u64,
    /// The same for a leaf (a function that calls nothing), whose
    /// instructions are on the whole shorter: no argument moves around
    /// calls, no values kept across them.
    pub leaf_bytes_per_instruction: u64,
    /// A function's frame setup and teardown beyond its instructions,
    /// where it calls (a leaf that needs no stack has none).
    pub frame_bytes: u64,
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
    /// register and 20 per parameter on the stack. A check of a stack
    /// limit read through `vmctx` (as wasmtime's) adds 23 bytes to a
    /// thunk or a function (measured: the thunks of the same groups of
    /// sqlite and resvg, with and without it). Members are sized by
    /// [`CostModel::function_bytes`]: 5 bytes per live instruction and 3
    /// of frame, plus the check, where they call, and 3 bytes per live
    /// instruction where they are leaves; fitted to the bytes measured
    /// against the other choices of 4 to 6 bytes per instruction, 0 to 6
    /// of frame and 3 to 5 per leaf instruction, it makes the most right
    /// decisions (`jitfold report --similar --compile --merge calls`).
    pub const X86_64: CostModel = CostModel {
        thunk_bytes: 13,
        thunk_bytes_per_param: 6,
        thunk_stack_bytes: 20,
        thunk_bytes_per_stack_arg: 6,
        thunk_stack_check_bytes: 23,
        body_bytes_per_param: 5,
        body_bytes_per_stack_param: 20,
        int_arg_registers: 6,
        float_arg_registers: 8,
        bytes_per_instruction: 5,
        leaf_bytes_per_instruction: 3,
        frame_bytes: 3,
    };

    /// The estimated code size of a function before it is compiled: its
    /// live instructions at [`bytes_per_instruction`](Self::bytes_per_instruction)
    /// each, its frame and its stack-limit check where it calls, and at
    /// [`leaf_bytes_per_instruction`](Self::leaf_bytes_per_instruction)
    /// each where it is a leaf (Cranelift compiles a leaf that needs no
    /// stack with no check).
    pub fn function_bytes(&self, lowered: Lowered) -> u64 {
        let instructions = u64::from(lowered.instructions);
        if !lowered.calls {
            return instructions * self.leaf_bytes_per_instruction;
        }
        let check = if lowered.stack_limited {
            self.thunk_stack_check_bytes
        } else {
            0
        };
        instructions * self.bytes_per_instruction + self.frame_bytes + check
    }

    /// The prediction for a group of members with signature `sig` whose
    /// code sizes are `member_bytes` (the first one's code becomes the
    /// body), merged with parameters of types `params`: the bytes removed
    /// are every member's code but the first's; the bytes added are one
    /// thunk per member (materializing the parameters, passing its
    /// arguments, checking the stack limit where `stack_limited`) and the
    /// body's growth.
    pub fn predict(
        &self,
        sig: &Signature,
        stack_limited: bool,
        member_bytes: &[u64],
        params: &[Type],
    ) -> Prediction {
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
        // The rule of x86-64 and aarch64 (the model's targets), for a
        // thunk that tail-calls (see `thunk_calling`).
        if stack_limited && !thunk_skips_stack_check(Architecture::X86_64, sig, params) {
            thunk += self.thunk_stack_check_bytes;
        }
        let body = (k - stack_params.min(k)) * self.body_bytes_per_param
            + stack_params * self.body_bytes_per_stack_param;
        Prediction {
            removed,
            added: n * thunk + body,
        }
    }

    /// The bound, in bytes, on how much more stack a call of a merged
    /// member of signature `sig` uses before its body's stack-limit check
    /// than the member compiled alone would (see [`StackDepth`]), with
    /// parameters of types `params`: a thunk's frame
    /// ([`THUNK_FRAME_BYTES`]), every stack argument of the body's call
    /// (a thunk that calls has them in its frame; one that tail-calls
    /// grows the argument area by those beyond the member's, fewer), and
    /// [`SPILL_BYTES_PER_PARAM`] for each parameter and
    /// [`FRAME_ALIGNMENT_BYTES`] (the body's frame beyond the member's,
    /// which is otherwise the same function).
    pub fn stack_growth(&self, sig: &Signature, params: &[Type]) -> u64 {
        let own = sig.params.iter().map(|p| p.value_type);
        let stack_args = self.stack_args(own.chain(params.iter().copied())) as u64;
        THUNK_FRAME_BYTES
            + STACK_ARG_BYTES * stack_args.next_multiple_of(2)
            + SPILL_BYTES_PER_PARAM * params.len() as u64
            + FRAME_ALIGNMENT_BYTES
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

/// Whether the thunk of a member with signature `sig`, calling a body
/// that takes parameters of types `params` after the member's own
/// arguments, leaves out the member's stack-limit check on a target of
/// architecture `arch`: on x86-64 and aarch64 only, when member and body
/// use the `tail` convention (the thunk then tail-calls the body, where
/// the target compiles a tail call) and every argument of the body is
/// passed in a register, with no return area. (Other targets lay out
/// frames otherwise: s390x, for one, gives every function with frame
/// pointers a frame of its own below the caller's, which no caller's
/// check counts, and passes only four floats in registers.)
///
/// Such a thunk writes nothing to the stack but its saved frame pointer,
/// at the address where the member's own prologue saves it before its
/// check, and leaves nothing behind: its tail call reuses the member's
/// incoming argument area unchanged, so the body's prologue starts at the
/// member's stack pointer and checks the limit against the body's frame.
/// Cranelift 0.135.8 makes the same call for the saved frame pointer: a
/// function's check counts the setup area its callees need, not its own
/// (`gen_prologue` in `machinst/abi.rs`, "the current function's setup
/// area needs to be accounted for in the caller's stack limit check").
/// A thunk whose tail call grows the argument area (the body takes stack
/// arguments the member does not) writes below the member's stack
/// pointer before the body runs, so it keeps the check, as does every
/// thunk that calls and returns.
///
/// In registers means, counted conservatively for both targets: every
/// argument is an integer of at most 64 bits or an `f32` or `f64` with
/// an ordinary or `vmctx` purpose, at most six integers (x86-64's `tail`
/// convention passes six in registers, `get_intreg_for_arg` in
/// `isa/x64/abi.rs`; aarch64's passes `x2` to `x7`, as its
/// `compute_arg_locs` reserves `x0` and `x1`) and at most eight floats
/// (`xmm0` to `xmm7`; `v0` to `v7`), and at most one result, which is
/// returned in a register on both (a return area is only needed for more).
pub fn thunk_skips_stack_check(arch: Architecture, sig: &Signature, params: &[Type]) -> bool {
    let target = matches!(arch, Architecture::X86_64 | Architecture::Aarch64(_));
    if !target || sig.call_conv != CallConv::Tail || sig.returns.len() > 1 {
        return false;
    }
    let plain = |p: &AbiParam| {
        matches!(
            p.purpose,
            ArgumentPurpose::Normal | ArgumentPurpose::VMContext
        )
    };
    if !sig.params.iter().all(plain) || !sig.returns.iter().all(plain) {
        return false;
    }
    let types = sig.params.iter().map(|p| p.value_type);
    let results = sig.returns.iter().map(|p| p.value_type);
    let scalar = |ty: Type| ty.is_int() && ty.bits() <= 64 || ty == types::F32 || ty == types::F64;
    if !types
        .clone()
        .chain(results)
        .chain(params.iter().copied())
        .all(scalar)
    {
        return false;
    }
    let all = types.chain(params.iter().copied());
    let floats = all.clone().filter(|ty| ty.is_float()).count();
    let ints = all.count() - floats;
    ints <= TAIL_INT_ARG_REGISTERS && floats <= TAIL_FLOAT_ARG_REGISTERS
}

/// Integer arguments the `tail` convention passes in registers on both
/// x86-64 and aarch64 (see [`thunk_skips_stack_check`]).
const TAIL_INT_ARG_REGISTERS: usize = 6;
/// Float arguments the `tail` convention passes in registers on both
/// x86-64 and aarch64.
const TAIL_FLOAT_ARG_REGISTERS: usize = 8;

/// A thunk's frame in [`CostModel::stack_growth`]: the return address and
/// the saved frame pointer (x86-64 and aarch64).
pub const THUNK_FRAME_BYTES: u64 = 16;
/// One stack argument's slot (x86-64 and aarch64), in
/// [`CostModel::stack_growth`]; the area is kept 16-byte aligned.
pub const STACK_ARG_BYTES: u64 = 8;
/// What [`CostModel::stack_growth`] counts for the alignment of a body's
/// frame: Cranelift keeps the saved registers and the spill and stack
/// slots each 16-byte aligned, so a few more bytes in either may take up
/// to 8 more.
pub const FRAME_ALIGNMENT_BYTES: u64 = 16;
/// What [`CostModel::stack_growth`] counts for each parameter of a body:
/// a spill slot or a saved register for a parameter held across the body
/// (every parameter is an integer, pointer or scalar float of at most 8
/// bytes). A model: the register allocator may lay out the body's frame
/// otherwise than the member's; `jitfold report --similar --compile`
/// measures the difference on a corpus (`stack growth`).
pub const SPILL_BYTES_PER_PARAM: u64 = 8;

/// What similar merging promises about the stack depth at which a
/// function with a stack limit (`Function::stack_limit`) traps.
///
/// Every frame still checks the limit under either choice: a merged body
/// keeps its own check against its own frame, and a thunk checks the
/// member's limit against its own frame (one that tail-calls with every
/// argument in a register leaves no frame and has no check:
/// [`thunk_skips_stack_check`]), so no stack overflow goes
/// undetected. What merging moves is the depth: a call of a merged member
/// passes through its thunk (which, where both use the `tail` convention
/// and the target compiles tail calls, jumps to the body and leaves no
/// frame behind) into a body that may need a larger frame and more stack
/// arguments, so it may trap for stack exhaustion a little sooner than
/// the member compiled alone. Nothing else changes: results, other traps,
/// addresses. (One more case, which no real stack has: Cranelift checks a
/// frame by adding its size to the limit, which wraps for a limit within
/// that size of the top of the address space, so with such a limit a
/// thunk's frame and the member's may disagree on whether to trap.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackDepth {
    /// Functions with a stack limit are never merged: each traps at
    /// exactly the depth its own code does.
    Exact,
    /// Functions with a stack limit are merged in groups whose
    /// [`CostModel::stack_growth`] is at most `max_growth` bytes: a call
    /// of a merged member uses at most that much more stack before its
    /// body's check (by that model) than the member alone would, per
    /// level of calls.
    Bounded {
        /// The largest growth a merged group may have, in bytes.
        max_growth: u64,
    },
}

impl StackDepth {
    /// The default bound: 160 bytes per call, which every group of eight
    /// parameters at most (the default limit) whose body takes eight or
    /// fewer arguments on the stack fits (16 + 8 × 8 + 8 × 8 + 16). For
    /// scale: wasmtime's default stack for wasm is 512 KiB, so a chain of
    /// 100 calls of merged functions may trap for stack exhaustion at most
    /// 15.6 KiB (3.1% of that stack) sooner.
    pub const DEFAULT: StackDepth = StackDepth::Bounded { max_growth: 160 };

    /// Whether a function that checks a stack limit may be merged at all.
    pub fn merges_stack_limited(&self) -> bool {
        matches!(self, StackDepth::Bounded { .. })
    }
}

/// Limits of similar-function merging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimilarOptions {
    /// At most this many parameters per body.
    pub max_params: usize,
    /// The cost model.
    pub model: CostModel,
    /// Whether (and within which bound) functions with a stack limit are
    /// merged.
    pub stack: StackDepth,
}

impl SimilarOptions {
    /// Eight parameters at most, the x86-64 cost model
    /// ([`CostModel::X86_64`]), and functions with a stack limit merged
    /// within [`StackDepth::DEFAULT`].
    pub const DEFAULT: SimilarOptions = SimilarOptions {
        max_params: 8,
        model: CostModel::X86_64,
        stack: StackDepth::DEFAULT,
    };

    /// These options with functions that check a stack limit never merged
    /// ([`StackDepth::Exact`]).
    pub const fn with_exact_stack_depth(self) -> SimilarOptions {
        SimilarOptions {
            stack: StackDepth::Exact,
            ..self
        }
    }
}

impl Default for SimilarOptions {
    fn default() -> Self {
        Self::DEFAULT
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
    /// Left alone: its members check a stack limit and its
    /// [`CostModel::stack_growth`] is above what [`SimilarOptions::stack`]
    /// allows.
    StackGrowth,
}

/// The plan of one group of one shape.
#[derive(Clone, Debug)]
pub struct GroupPlan {
    /// Its parameters.
    pub derived: Derived,
    /// The cost model's prediction.
    pub prediction: Prediction,
    /// Where the members check a stack limit: the group's
    /// [`CostModel::stack_growth`].
    pub stack_growth: Option<u64>,
    /// What to do.
    pub decision: Decision,
}

/// Plans a group whose members (two or more, all of one shape, mergeable,
/// with signature `sig`, checking a stack limit when `stack_limited`)
/// have the site values `members` and code sizes `member_bytes`; `None`
/// if they are not of one shape.
pub fn plan_group(
    sig: &Signature,
    stack_limited: bool,
    members: &[&[ParamValue]],
    member_bytes: &[u64],
    options: &SimilarOptions,
) -> Option<GroupPlan> {
    let derived = derive(members)?;
    let types: Vec<Type> = derived.params.iter().map(|p| p.ty).collect();
    let prediction = options
        .model
        .predict(sig, stack_limited, member_bytes, &types);
    let stack_growth = stack_limited.then(|| options.model.stack_growth(sig, &types));
    let growth_allowed = match (stack_growth, options.stack) {
        (None, _) => true,
        (Some(_), StackDepth::Exact) => false,
        (Some(growth), StackDepth::Bounded { max_growth }) => growth <= max_growth,
    };
    let decision = if derived.params.len() > options.max_params {
        Decision::TooManyParams
    } else if !growth_allowed {
        Decision::StackGrowth
    } else if !prediction.pays() {
        Decision::DoesNotPay
    } else {
        Decision::Merge
    };
    Some(GroupPlan {
        derived,
        prediction,
        stack_growth,
        decision,
    })
}

/// Splits a group of one shape (site values `members`, in member order)
/// into subgroups whose parameters fit `max_params`: each member joins the
/// first subgroup it fits in, or starts one. (Swift's merger drops the most
/// divergent member and retries; this keeps every member that fits with
/// some other.) Returns member indices; a subgroup of one is a member left
/// alone.
///
/// Bounded for large groups: a member tries at most [`SPLIT_TRIES`]
/// subgroups, and a subgroup whose first member differs from it in more
/// than `max_params` distinct pairs of values (each such pair needs a
/// parameter of its own) is passed over without deriving the parameters.
pub fn split(members: &[&[ParamValue]], max_params: usize) -> Vec<Vec<usize>> {
    let mut subgroups: Vec<Vec<usize>> = Vec::new();
    let mut trial: Vec<&[ParamValue]> = Vec::new();
    let mut pairs: Vec<(&SiteValue, &SiteValue)> = Vec::new();
    'member: for (i, &m) in members.iter().enumerate() {
        for g in subgroups.iter_mut().take(SPLIT_TRIES) {
            let first = members[g[0]];
            if distinct_differences(first, m, &mut pairs) > max_params {
                continue;
            }
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

/// How many subgroups [`split`] tries for each member.
pub const SPLIT_TRIES: usize = 32;

/// The number of distinct pairs of values at the sites where `a` and `b`
/// differ (every pair needs a parameter of its own), counted with `pairs`
/// as scratch; `usize::MAX` if they do not have the same sites.
fn distinct_differences<'a>(
    a: &'a [ParamValue],
    b: &'a [ParamValue],
    pairs: &mut Vec<(&'a SiteValue, &'a SiteValue)>,
) -> usize {
    if a.len() != b.len() {
        return usize::MAX;
    }
    pairs.clear();
    for (x, y) in a.iter().zip(b) {
        let pair = (&x.value, &y.value);
        if pair.0 != pair.1 && !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    pairs.len()
}
