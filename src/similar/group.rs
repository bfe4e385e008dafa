//! Groups of one shape: parameters derived from the members' values, the
//! byte cost model, and splitting groups that need too many parameters
//! (see the [module docs](super)).

use super::shape::{ParamKind, ParamValue, SiteValue};
use cranelift_codegen::ir::{Signature, Type};
use hashbrown::HashMap;

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

impl SimilarOptions {
    /// Six parameters at most, and the x86-64 cost model
    /// ([`CostModel::X86_64`]).
    pub const DEFAULT: SimilarOptions = SimilarOptions {
        max_params: 6,
        model: CostModel::X86_64,
    };
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
