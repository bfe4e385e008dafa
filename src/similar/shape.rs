//! Shapes: which constants of a function are parameter sites, and the
//! function's key with them masked (see the [module docs](super)).

use crate::fingerprint::{Shape, SymbolName, Walk};
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::instructions::InstructionMapper;
use cranelift_codegen::ir::{
    self, ArgumentPurpose, Block, BlockCall, ExceptionTable, ExceptionTableItem, FuncRef, Function,
    GlobalValue, GlobalValueData, Inst, JumpTable, Opcode, SigRef, Signature, StackSlot, Type,
    Value, ValueList, types,
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
    /// A function called directly (`call`): the body calls it through a
    /// pointer the thunk passes (`func_addr`).
    Callee,
}

/// What a parameter site holds in one function.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SiteValue {
    /// A constant's raw immediate bits, as stored in the instruction (an
    /// `f32const`'s zero-extended).
    Bits(i64),
    /// A callee: its name, and the signature it is called with.
    Callee(SymbolName, Signature),
}

/// The value of one parameter site of one function.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParamValue {
    /// What the site is.
    pub kind: ParamKind,
    /// Its type (the constant's controlling type; a callee's is the
    /// pointer type, [`CALLEE_TYPE`]).
    pub ty: Type,
    /// What it holds.
    pub value: SiteValue,
}

/// The type of a callee parameter: a function pointer on the 64-bit
/// targets jitfold supports.
pub const CALLEE_TYPE: Type = types::I64;

/// Where a parameter site is in a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Site {
    /// A constant instruction.
    Constant(Inst),
    /// Every `call` of the function with this name (a name slot of the
    /// walk: every use of the name is such a call).
    Callee(SymbolName),
}

/// A function's shape and its parameter sites.
#[derive(Clone, Debug)]
pub struct ShapeOf {
    /// The shape (see the [module docs](super)).
    pub shape: Shape,
    /// Each site: the constants in walk order, then the callees in name
    /// slot order.
    pub sites: Vec<Site>,
    /// The value of each site, in the order of `sites`.
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
    /// How each name slot of the walk is used.
    name_uses: Vec<SiteUse>,
    /// The name slot of each function reference, if it has one.
    slot_of_ref: SecondaryMap<FuncRef, u32>,
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
            name_uses: Vec::new(),
            slot_of_ref: SecondaryMap::with_default(NO_SITE),
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
        let names = walk.names();
        self.name_uses.clear();
        self.name_uses.resize(names.len(), SiteUse::Unused);
        self.slot_of_ref.clear();
        for (func_ref, data) in dfg.ext_funcs.iter() {
            if let Some(slot) = SymbolName::of(func, &data.name)
                .and_then(|name| names.iter().position(|n| *n == name))
            {
                self.slot_of_ref[func_ref] = slot as u32;
            }
        }
        // A name a global value refers to is used as data.
        for gv in func.global_values.values() {
            if let GlobalValueData::Symbol { name, .. } = gv
                && let Some(name) = SymbolName::of(func, name)
                && let Some(slot) = names.iter().position(|n| *n == name)
            {
                self.name_uses[slot] = SiteUse::Excluded;
            }
        }
        for block in func.layout.blocks() {
            for inst in func.layout.block_insts(block) {
                if !candidates.is_empty() {
                    self.uses_of(func, inst);
                }
                self.names_used_by(func, inst);
            }
        }
        let key = walk.key().key();
        self.words.clear();
        // The template part of the key; the names follow it.
        let mut names_section = Vec::new();
        crate::fingerprint::encode_names(&mut names_section, names);
        let template_len = key.len() - names_section.len();
        self.words.extend_from_slice(&key[..template_len]);
        let mut masked = Vec::new();
        let mut sites = Vec::new();
        let mut values = Vec::new();
        for (site, &used) in candidates.iter().zip(&self.uses) {
            let w = site.word as usize;
            let Some((kind, width)) = constant_kind(dfg.insts[site.inst].opcode()) else {
                continue;
            };
            if used != SiteUse::Ordinary || w + width > template_len {
                continue;
            }
            let Some(&result) = dfg.inst_results(site.inst).first() else {
                continue;
            };
            let high = if width == 2 { u64::from(key[w + 1]) } else { 0 };
            let bits = (u64::from(key[w]) | high << 32) as i64;
            self.words[w..w + width].fill(0);
            masked.push(site.word);
            sites.push(Site::Constant(site.inst));
            values.push(ParamValue {
                kind,
                ty: dfg.value_type(result),
                value: SiteValue::Bits(bits),
            });
        }
        // The names, each callee site's replaced by a placeholder; the
        // list of masked slots below keeps the placeholder apart from a
        // name that stays.
        let mut shaped_names = names.to_vec();
        let mut masked_slots = Vec::new();
        for (slot, &used) in self.name_uses.iter().enumerate() {
            if used != SiteUse::Ordinary {
                continue;
            }
            let Some(sig) = self.callee_signature(func, slot) else {
                continue;
            };
            let name = std::mem::replace(&mut shaped_names[slot], PLACEHOLDER_NAME);
            masked_slots.push(slot as u32);
            sites.push(Site::Callee(name.clone()));
            values.push(ParamValue {
                kind: ParamKind::Callee,
                ty: CALLEE_TYPE,
                value: SiteValue::Callee(name, sig),
            });
        }
        crate::fingerprint::encode_names(&mut self.words, &shaped_names);
        self.words.push(masked.len() as u32);
        self.words.extend_from_slice(&masked);
        self.words.push(masked_slots.len() as u32);
        self.words.extend_from_slice(&masked_slots);
        ShapeOf {
            shape: Shape::of_words(self.words.clone(), walk.instructions()),
            sites,
            values,
        }
    }

    /// Qualifies the name slots `inst` refers to: a `call`'s callee is an
    /// ordinary use, any other reference (a `return_call`, `try_call` or
    /// `func_addr`) excludes the name.
    fn names_used_by(&mut self, func: &Function, inst: Inst) {
        let data = &func.dfg.insts[inst];
        for func_ref in func_refs_of(data) {
            let slot = self.slot_of_ref[func_ref];
            if slot == NO_SITE {
                continue;
            }
            let used = &mut self.name_uses[slot as usize];
            *used = match (*used, data.opcode() == Opcode::Call) {
                (SiteUse::Excluded, _) | (_, false) => SiteUse::Excluded,
                _ => SiteUse::Ordinary,
            };
        }
    }

    /// The signature every `call` of name slot `slot` uses, or `None` if
    /// they use more than one (the body would need one pointer per
    /// signature: the slot stays in the shape) or a reference to it is
    /// `patchable` (a `call_indirect` has no patchable call site).
    fn callee_signature(&self, func: &Function, slot: usize) -> Option<Signature> {
        let mut sig = None;
        for (func_ref, data) in func.dfg.ext_funcs.iter() {
            if self.slot_of_ref[func_ref] as usize != slot {
                continue;
            }
            if data.patchable {
                return None;
            }
            let this = func.dfg.signatures.get(data.signature)?;
            match &sig {
                None => sig = Some(this.clone()),
                Some(s) if s == this => {}
                Some(_) => return None,
            }
        }
        sig
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

/// What stands for a masked callee's name in a shape.
const PLACEHOLDER_NAME: SymbolName = SymbolName::User(ir::UserExternalName {
    namespace: u32::MAX,
    index: u32::MAX,
});

/// The function references an instruction refers to (an
/// [`InstructionMapper`] that changes nothing, so that Cranelift's own
/// generated code lists every reference of every instruction format).
#[derive(Default)]
struct FuncRefs(Vec<FuncRef>);

impl InstructionMapper for FuncRefs {
    fn map_value(&mut self, value: Value) -> Value {
        value
    }
    fn map_value_list(&mut self, value_list: ValueList) -> ValueList {
        value_list
    }
    fn map_global_value(&mut self, global_value: GlobalValue) -> GlobalValue {
        global_value
    }
    fn map_jump_table(&mut self, jump_table: JumpTable) -> JumpTable {
        jump_table
    }
    fn map_exception_table(&mut self, exception_table: ExceptionTable) -> ExceptionTable {
        exception_table
    }
    fn map_block_call(&mut self, block_call: BlockCall) -> BlockCall {
        block_call
    }
    fn map_block(&mut self, block: Block) -> Block {
        block
    }
    fn map_func_ref(&mut self, func_ref: FuncRef) -> FuncRef {
        self.0.push(func_ref);
        func_ref
    }
    fn map_sig_ref(&mut self, sig_ref: SigRef) -> SigRef {
        sig_ref
    }
    fn map_stack_slot(&mut self, stack_slot: StackSlot) -> StackSlot {
        stack_slot
    }
    fn map_dynamic_stack_slot(
        &mut self,
        dynamic_stack_slot: ir::DynamicStackSlot,
    ) -> ir::DynamicStackSlot {
        dynamic_stack_slot
    }
    fn map_constant(&mut self, constant: ir::Constant) -> ir::Constant {
        constant
    }
    fn map_immediate(&mut self, immediate: ir::Immediate) -> ir::Immediate {
        immediate
    }
}

/// The function references `data` refers to, by Cranelift's own list of
/// each instruction format's entities.
pub(super) fn func_refs_of(data: &ir::InstructionData) -> Vec<FuncRef> {
    let mut refs = FuncRefs::default();
    data.map(&mut refs);
    refs.0
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
