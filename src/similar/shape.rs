//! Shapes: which constants of a function are parameter sites, and the
//! function's key with them masked (see the [module docs](super)).

use super::group::StackDepth;
use crate::fingerprint::{Shape, SymbolName, Walk};
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::instructions::InstructionMapper;
use cranelift_codegen::ir::{
    self, ArgumentPurpose, Block, BlockCall, ExceptionTable, ExceptionTableItem, ExternalName,
    FuncRef, Function, GlobalValue, GlobalValueData, Inst, JumpTable, Opcode, SigRef, Signature,
    StackSlot, Type, Value, ValueList, types,
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
    /// A function whose address is taken (`func_addr`): the thunk passes
    /// the address.
    FunctionAddress,
    /// A symbol whose address is taken (`symbol_value` of a global value
    /// without offset, not thread-local): the thunk passes the address.
    SymbolAddress,
}

/// What a parameter site holds in one function.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SiteValue {
    /// A constant's raw immediate bits, as stored in the instruction (an
    /// `f32const`'s zero-extended).
    Bits(i64),
    /// A function (a callee, or a function whose address is taken): its
    /// name, and the signature its references declare.
    Function(SymbolName, Signature),
    /// A symbol whose address is taken: its name.
    Symbol(SymbolName),
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
    /// Every `func_addr` of the function with this name (every use of the
    /// name is one).
    FunctionAddress(SymbolName),
    /// Every `symbol_value` of a global value that is this name without
    /// offset (every use of the name is one).
    SymbolAddress(SymbolName),
}

/// How the references to a name slot seen so far use it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NameUse {
    Unused,
    /// Only as the callee of `call`s.
    Callee,
    /// Only by `func_addr`s.
    FunctionAddress,
    /// Only through global values that are the name without offset, not
    /// thread-local, and not the base of another global value, by
    /// `symbol_value`.
    SymbolAddress,
    Excluded,
}

impl NameUse {
    /// The use of a name used as `self` so far and now as `other`.
    fn and(self, other: NameUse) -> NameUse {
        match (self, other) {
            (NameUse::Unused, other) => other,
            (this, other) if this == other => this,
            _ => NameUse::Excluded,
        }
    }
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
    name_uses: Vec<NameUse>,
    /// The name slot of each function reference, if it has one.
    slot_of_ref: SecondaryMap<FuncRef, u32>,
    /// The name slot of each global value that is a symbol, if it has one.
    slot_of_gv: SecondaryMap<GlobalValue, u32>,
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
            slot_of_gv: SecondaryMap::with_default(NO_SITE),
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
        self.name_uses.resize(names.len(), NameUse::Unused);
        self.slot_of_ref.clear();
        for (func_ref, data) in dfg.ext_funcs.iter() {
            if let Some(slot) = SymbolName::of(func, &data.name)
                .and_then(|name| names.iter().position(|n| *n == name))
            {
                self.slot_of_ref[func_ref] = slot as u32;
            }
        }
        self.symbols(func, names);
        for block in func.layout.blocks() {
            for inst in func.layout.block_insts(block) {
                if !candidates.is_empty() {
                    self.uses_of(func, inst);
                }
                self.names_used_by(func, inst);
            }
        }
        let key = walk.key().template_key();
        self.words.clear();
        // The template part of the key; the names follow it.
        let template_len = key.len();
        self.words.extend_from_slice(key);
        let mut masked = Vec::new();
        let mut sites = Vec::new();
        let mut values = Vec::new();
        for (site, &used) in candidates.iter().zip(&self.uses) {
            let w = site.word as usize;
            let Some((kind, width)) = constant_kind(dfg.insts[site.inst].opcode()) else {
                continue;
            };
            if w + width > template_len {
                continue;
            }
            if used == SiteUse::Unused {
                // No instruction uses it: its value decides nothing
                // Cranelift emits (see 1 in the module docs). Masked, and
                // no parameter; a body keeps its first member's value.
                self.words[w..w + width].fill(0);
                masked.push(site.word);
                continue;
            }
            if used != SiteUse::Ordinary {
                continue;
            }
            let Some(&result) = dfg.inst_results(site.inst).first() else {
                continue;
            };
            let high = if width == 2 { u64::from(key[w + 1]) } else { 0 };
            let bits = (u64::from(key[w]) | high << 32) as i64;
            let ty = dfg.value_type(result);
            // An `iconst` whose bits do not fit its type (only with the
            // verifier off: `iconst_bounds` rejects it) folds in the
            // mid-end otherwise than a parameter of its type would
            // (`uextend` of it keeps the high bits): it stays in the shape.
            if kind == ParamKind::Int && !fits(bits, ty) {
                continue;
            }
            self.words[w..w + width].fill(0);
            masked.push(site.word);
            sites.push(Site::Constant(site.inst));
            values.push(ParamValue {
                kind,
                ty,
                value: SiteValue::Bits(bits),
            });
        }
        // The names, each name site's replaced by a placeholder; the list
        // of masked slots below keeps the placeholder apart from a name
        // that stays.
        let mut shaped_names = names.to_vec();
        let mut masked_slots = Vec::new();
        for (slot, &used) in self.name_uses.iter().enumerate() {
            let name = &names[slot];
            let (kind, site, value) = match used {
                NameUse::Unused | NameUse::Excluded => continue,
                NameUse::Callee | NameUse::FunctionAddress => {
                    let Some(sig) = self.function_signature(func, slot) else {
                        continue;
                    };
                    let value = SiteValue::Function(name.clone(), sig);
                    if used == NameUse::Callee {
                        (ParamKind::Callee, Site::Callee(name.clone()), value)
                    } else {
                        let site = Site::FunctionAddress(name.clone());
                        (ParamKind::FunctionAddress, site, value)
                    }
                }
                NameUse::SymbolAddress => (
                    ParamKind::SymbolAddress,
                    Site::SymbolAddress(name.clone()),
                    SiteValue::Symbol(name.clone()),
                ),
            };
            shaped_names[slot] = PLACEHOLDER_NAME;
            masked_slots.push(slot as u32);
            sites.push(site);
            values.push(ParamValue {
                kind,
                ty: CALLEE_TYPE,
                value,
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

    /// Maps the global values that are symbols to their name slots, and
    /// excludes the names of those that are not a plain address (with an
    /// offset, thread-local, the base of another global value, or a
    /// dynamic vector type's scale).
    fn symbols(&mut self, func: &Function, names: &[SymbolName]) {
        self.slot_of_gv.clear();
        let slot_of = |name| {
            SymbolName::of(func, name).and_then(|name| names.iter().position(|n| *n == name))
        };
        for (gv, data) in func.global_values.iter() {
            if let GlobalValueData::Symbol {
                name, offset, tls, ..
            } = data
                && let Some(slot) = slot_of(name)
            {
                self.slot_of_gv[gv] = slot as u32;
                if *tls || offset.bits() != 0 {
                    self.name_uses[slot] = NameUse::Excluded;
                }
            }
        }
        for data in func.global_values.values() {
            let base = match data {
                GlobalValueData::Load { base, .. } | GlobalValueData::IAddImm { base, .. } => *base,
                GlobalValueData::VMContext
                | GlobalValueData::Symbol { .. }
                | GlobalValueData::DynScaleTargetConst { .. } => continue,
            };
            let slot = self.slot_of_gv[base];
            if slot != NO_SITE {
                self.name_uses[slot as usize] = NameUse::Excluded;
            }
        }
        // A dynamic vector type's scale is a global value the body would
        // keep as it is.
        for ty in func.dfg.dynamic_types.values() {
            let slot = self.slot_of_gv[ty.dynamic_scale];
            if slot != NO_SITE {
                self.name_uses[slot as usize] = NameUse::Excluded;
            }
        }
    }

    /// Qualifies the name slots `inst` refers to: a `call`'s callee, a
    /// `func_addr`'s function, or a `symbol_value`'s symbol (see
    /// [`NameUse`]); any other reference (a `return_call`, `try_call` or
    /// `tls_value`) excludes the name.
    fn names_used_by(&mut self, func: &Function, inst: Inst) {
        let data = &func.dfg.insts[inst];
        let opcode = data.opcode();
        let refs = references_of(data);
        for func_ref in refs.funcs {
            let slot = self.slot_of_ref[func_ref];
            if slot == NO_SITE {
                continue;
            }
            let use_ = match opcode {
                Opcode::Call => NameUse::Callee,
                Opcode::FuncAddr => NameUse::FunctionAddress,
                _ => NameUse::Excluded,
            };
            let used = &mut self.name_uses[slot as usize];
            *used = used.and(use_);
        }
        for gv in refs.global_values {
            let slot = self.slot_of_gv[gv];
            if slot == NO_SITE {
                continue;
            }
            let use_ = match opcode {
                Opcode::SymbolValue => NameUse::SymbolAddress,
                _ => NameUse::Excluded,
            };
            let used = &mut self.name_uses[slot as usize];
            *used = used.and(use_);
        }
    }

    /// The signature every reference to the function of name slot `slot`
    /// declares, or `None` if they declare more than one (the body would
    /// need one pointer per signature: the slot stays in the shape) or a
    /// reference to it is `patchable` (a `call_indirect` has no patchable
    /// call site).
    fn function_signature(&self, func: &Function, slot: usize) -> Option<Signature> {
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

/// The function references and global values an instruction refers to
/// (an [`InstructionMapper`] that changes nothing, so that Cranelift's own
/// generated code lists every reference of every instruction format).
#[derive(Default)]
pub(super) struct References {
    pub(super) funcs: Vec<FuncRef>,
    pub(super) global_values: Vec<GlobalValue>,
}

impl InstructionMapper for References {
    fn map_value(&mut self, value: Value) -> Value {
        value
    }
    fn map_value_list(&mut self, value_list: ValueList) -> ValueList {
        value_list
    }
    fn map_global_value(&mut self, global_value: GlobalValue) -> GlobalValue {
        self.global_values.push(global_value);
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
        self.funcs.push(func_ref);
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

/// The function references and global values `data` refers to, by
/// Cranelift's own list of each instruction format's entities.
pub(super) fn references_of(data: &ir::InstructionData) -> References {
    let mut refs = References::default();
    data.map(&mut refs);
    refs
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

/// Whether global value `gv` of `func` and those it is computed from exist,
/// form no cycle and name only declared names: what a thunk copies of a
/// member's stack limit (the verifier checks as much, but may be off).
fn global_value_is_well_formed(func: &Function, gv: GlobalValue) -> bool {
    let mut at = gv;
    // A chain longer than there are global values has a cycle.
    for _ in 0..=func.global_values.len() {
        let Some(data) = func.global_values.get(at) else {
            return false;
        };
        match data {
            GlobalValueData::VMContext | GlobalValueData::DynScaleTargetConst { .. } => {
                return true;
            }
            GlobalValueData::Symbol { name, .. } => {
                return !matches!(name, ExternalName::User(_))
                    || SymbolName::of(func, name).is_some();
            }
            GlobalValueData::Load { base, flags, .. } => {
                if !func.dfg.mem_flags.is_valid(*flags) {
                    return false;
                }
                let region = func.dfg.mem_flags[*flags].alias_region();
                if region.is_some_and(|r| !func.dfg.alias_regions.is_valid(r)) {
                    return false;
                }
                at = *base;
            }
            GlobalValueData::IAddImm { base, .. } => at = *base,
        }
    }
    false
}

/// Whether the bits of an `iconst` of type `ty` are within the type, as
/// Cranelift's verifier requires (`iconst_bounds`: zero above the type's
/// width).
fn fits(bits: i64, ty: Type) -> bool {
    match ty.bits() {
        width @ 1..64 => (bits as u64) >> width == 0,
        64 => true,
        _ => false,
    }
}

/// Whether a thunk may stand in front of `func` and its body take appended
/// parameters (see the [module docs](super)); `observes_own_frame` is the
/// walk's [`Walk::observes_own_frame`]. A function with a stack limit only
/// when `stack` merges such functions ([`StackDepth`]: the thunk's frame
/// and the body's come between the caller and the body's check, which
/// then traps at a shallower depth of calls than the function compiled
/// alone does; the ABI adapters refuse such functions for that reason).
pub fn mergeable(func: &Function, observes_own_frame: bool, stack: StackDepth) -> bool {
    let sig = &func.signature;
    !observes_own_frame
        && func.stack_limit.is_none_or(|limit| {
            stack.merges_stack_limited() && global_value_is_well_formed(func, limit)
        })
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
