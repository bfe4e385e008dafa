//! Shapes: which constants of a function are parameter sites, and the
//! function's key with them masked (see the [module docs](super)).

use crate::fingerprint::{Shape, Walk};
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{
    ArgumentPurpose, ExceptionTableItem, Function, Inst, Opcode, Type, Value,
};
use cranelift_codegen::isa::CallConv;

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
    /// The shape (see the [module docs](super)).
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
pub(super) fn constant_kind(opcode: Opcode) -> Option<(ParamKind, usize)> {
    match opcode {
        Opcode::Iconst => Some((ParamKind::Int, 2)),
        Opcode::F64const => Some((ParamKind::Float, 2)),
        Opcode::F32const => Some((ParamKind::Float, 1)),
        _ => None,
    }
}

/// Whether operand `index` of an instruction with `opcode` is an ordinary
/// use (see the [module docs](super)).
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
/// parameters (see the [module docs](super)); `observes_own_frame` is the
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
