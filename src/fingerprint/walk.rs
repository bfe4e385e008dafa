//! The canonical walk: one pass over the reachable blocks in DFS pre-order,
//! numbering blocks, values and side-table entities on first sight, and
//! writing every semantic fact as 32-bit words.
//!
//! The encoding is prefix-free: every variable-length part is preceded by its
//! length or determined by what came before (an opcode determines its
//! instruction format), and every entity reference is its serial number,
//! where a number equal to the count of entities numbered so far means "new",
//! followed by the entity's definition. Decoding a key therefore yields the
//! function back up to renaming, which is why equal keys mean equal functions.
//! (Signatures and external functions are the one exception to "a number
//! equal to the count means new": a new one's definition comes before its
//! number, marked by a word no count reaches; see `declarations.rs`.)
//!
//! # Which numberings Cranelift's code generation depends on
//!
//! Audited in the source of Cranelift
//! [`CRANELIFT_VERSION`](super::CRANELIFT_VERSION) (paths under
//! `cranelift-codegen` `src/`). Where code generation reads a table by index or by identity,
//! the key keeps that; where it reads only content, the key numbers by
//! first use (or by content), so renumbered twins share a key. Two facts
//! decide most rows: the mid-end's GVN compares instructions field by
//! field, entity indices included (`egraph/mod.rs`, the generated
//! `InstructionData::eq`), so any entity a *pure* instruction names is
//! compared by identity; and there is no `global_value` instruction any
//! more, so global values reach code only through `symbol_value`,
//! `tls_value`, `stack_limit` and dynamic types.
//!
//! | table | what code generation reads | in the key |
//! |---|---|---|
//! | sized stack slots | index order: laid out one after another (`machinst/abi.rs`, `Callee::new`); unused slots move later ones; a slot's `key` reaches only frame metadata | every slot in index order but unused size-0 align-1 ones |
//! | dynamic stack slots | index order, after the sized slots, unused ones too (same place) | every slot in index order |
//! | dynamic types | content (sizes by concrete type, `Callee::new`, which makes every one concrete and panics on a base type too wide) | first use, content; the unused ones' base types as a set |
//! | global values | identity for `symbol_value`/`tls_value` (pure; lowering reads the `Symbol`, `machinst/lower.rs` `symbol_value_data`); content for `stack_limit` (`abi.rs` `generate_gv`) | first use, content, so two equal symbols stay two |
//! | signatures | content (`SigSet`, `abi.rs`), but an ABI is computed for every one, so an unused signature Cranelift cannot lower fails the compile | by content; the unused ones as a set of contents |
//! | external functions | content for calls (`func_ref_data`, `machinst/isle.rs`); identity for `func_addr` (pure) | by content; a `func_addr` also by first use of its `FuncRef` |
//! | constants, `dfg.immediates` | identity (GVN; x86-64 emits one pool entry per handle, `machinst/vcode.rs`); emitted in first-reference order (`machinst/buffer.rs`); the mid-end adds constants under the handle numbered as the pool's length and asserts it is new (`ConstantPool::insert`); if the pool holds the bytes, it takes their last handle, used or not | first use of the handle, bytes on first use, when the pool's handles are 0 to its length and their bytes all differ; otherwise the whole pool, and uses by handle |
//! | jump tables, exception tables | content, in order; identity when `remove_constant_phis` edits a table's entries in place, once per branch, and asserts on one that two branches share (`remove_constant_phis.rs`) | first use, content on first use |
//! | value lists (operands of calls and returns, branch arguments) | content; but the mid-end rewrites operands in place (`egraph/mod.rs`, `overwrite_inst_values` in `egraph/elaborate.rs`), so a list with operands two uses share (an `InstructionData` copied, a jump table cloned shallowly) is rewritten for both | by content; a function in which two reachable uses share one with operands gets a unique key |
//! | alias regions | identity in alias analysis (`alias_analysis.rs`); the verifier rejects two of one `user_id` | first use, `user_id` |
//! | memory flags | content (`MemFlagsSet` interns them) | by content |
//! | user stack maps, debug tags | metadata only | stack maps in place; debug tags not |
//! | value labels | whether any are collected keeps `vmctx` alive (`Lower::gen_return`); their contents are metadata | whether collected |
//! | cold blocks | placement: cold blocks last (`vcode.rs`) | a flag per block |
//! | instruction order in a block | order | layout order |
//! | block layout order | emission follows the CFG's reverse post-order, but virtual registers are numbered in layout order (`lower.rs`) and register allocation breaks ties by that number | not in the key: may change register choice, never behaviour |
//! | value numbers | the egraph breaks cost ties by value index (`egraph/elaborate.rs`) | not in the key: the same |
//! | block numbers | nothing found | not in the key |
//!
//! The last three rows are why the differential check's machine-code
//! oracle lays both functions out in one block order before it compares
//! their code: a key equates functions that behave the same, and their
//! code may still differ in register choice.

use super::declarations::{DECLARED_FUNCTION, DECLARED_SIGNATURE, Declarations};
use super::{BorrowedFingerprint, Fingerprint, KeyHashes, SymbolName, Template};
use cranelift_codegen::entity::{EntityRef, SecondaryMap};
use cranelift_codegen::ir::{
    self, AbiParam, ArgumentPurpose, Block, BlockArg, BlockCall, Constant, ConstantData,
    ConstantPool, DynamicStackSlot, DynamicType, ExceptionTableItem, ExternalName, FuncRef,
    Function, GlobalValue, GlobalValueData, Immediate, Inst, InstructionData, MemFlags, Opcode,
    SigRef, Signature, StackSlot, Type, Value, immediates::Offset32,
};
use cranelift_codegen::ir::{AliasRegion, Endianness};
use cranelift_codegen::isa::CallConv;
use hashbrown::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Serial numbers handed out on first sight, per entity kind.
struct Numbering<K: EntityRef> {
    /// 0 = not seen yet; otherwise serial number + 1.
    seen: SecondaryMap<K, u32>,
    next: u32,
}

impl<K: EntityRef> Numbering<K> {
    fn new() -> Self {
        Self {
            seen: SecondaryMap::new(),
            next: 0,
        }
    }

    fn reset(&mut self, capacity: usize) {
        self.seen.clear();
        self.seen.resize(capacity);
        self.next = 0;
    }

    /// The serial number of `k` and whether it was assigned by this call.
    #[inline]
    fn number(&mut self, k: K) -> (u32, bool) {
        match self.seen[k] {
            0 => {
                let n = self.next;
                self.next += 1;
                self.seen[k] = n + 1;
                (n, true)
            }
            n => (n - 1, false),
        }
    }
}

/// Marks a result or block parameter whose value was already numbered by an
/// earlier use (only possible in functions that fail the verifier).
const ALREADY_NUMBERED: u32 = 1 << 31;
/// Set in a block's first word when the block is marked cold (it is laid
/// out at the end of the code).
const COLD_BLOCK: u32 = 1 << 31;
/// Set in an instruction's first word when user stack map entries follow.
const HAS_STACK_MAP: u32 = 1 << 31;
/// What a reference to an entity that does not exist writes (only in
/// functions that fail the verifier). Such references are never numbered:
/// their index may be anything, and numbering indexes a table by it.
const MISSING: u32 = u32::MAX;
/// Set in a use of a sized stack slot of size 0 and alignment 1, which is
/// not in the frame layout; the rest is the number of slots before it.
const EMPTY_SLOT: u32 = 1 << 31;

/// Computes fingerprints, reusing its scratch memory across functions.
///
/// Keeping one `Fingerprinter` per thread and calling
/// [`Fingerprinter::walk`] (or [`Fingerprinter::fingerprint`]) for each
/// function avoids allocating the numbering tables again for every
/// function.
pub struct Fingerprinter {
    out: Vec<u32>,
    blocks: Numbering<Block>,
    values: Numbering<Value>,
    sigs: Numbering<SigRef>,
    func_refs: Numbering<FuncRef>,
    /// Function references used by `func_addr`, by identity (see
    /// [`Declarations`]).
    func_addrs: Numbering<FuncRef>,
    global_values: Numbering<GlobalValue>,
    dynamic_types: Numbering<DynamicType>,
    regions: Numbering<AliasRegion>,
    jump_tables: Numbering<ir::JumpTable>,
    exception_tables: Numbering<ir::ExceptionTable>,
    visited: SecondaryMap<Block, bool>,
    stack: Vec<Block>,
    successors: Vec<Block>,
    /// Per sized stack slot, by index: what a use of it writes (see
    /// [`Fingerprinter::frame_layout`]).
    slot_codes: Vec<u32>,
    declarations: Declarations,
    constant_handles: Vec<Constant>,
    /// Whether the constant pool is in the key whole, and its uses by
    /// handle (see [`Fingerprinter::constant_pool`]).
    pool_by_handle: bool,
    /// Constant-pool and `dfg.immediates` handles, by identity (see
    /// [`Fingerprinter::constant`]).
    constants: Numbering<Constant>,
    immediates: Numbering<Immediate>,
    /// User and test-case names in first-use order: slot `i` is `names[i]`.
    names: Vec<SymbolName>,
    /// Per slot: whether a reachable instruction uses the name as data.
    address_taken: Vec<bool>,
    /// The name slot of each numbered `FuncRef` (`u32::MAX`: none).
    func_ref_slots: SecondaryMap<FuncRef, u32>,
    /// Whether an instruction encoded observes its own frame (see
    /// [`Walk::observes_own_frame`]).
    observes_frame: bool,
    /// The `iconst`, `f32const` and `f64const` instructions encoded, with
    /// where their immediates are in the key (see [`Walk::constant_sites`]).
    constant_sites: Vec<ImmediateSite>,
    /// Per value-list pool index: the walk that last saw the list (see
    /// [`Fingerprinter::note_list`]).
    list_stamps: Vec<u32>,
    /// This walk's stamp in `list_stamps`.
    stamp: u32,
    /// Whether the key is to hold a number no other key of this process
    /// has (see [`Walk::key_is_unique`]).
    unique_key: bool,
    /// Whether an instruction encoded named a value, block, jump table or
    /// exception table that is not in its table (see
    /// [`Walk::named_values_exist`]).
    named_missing: bool,
    /// What the last walk found beside the key in `out`.
    last: LastKey,
}

/// An `iconst`, `f32const` or `f64const` instruction the walk encoded, and
/// where in the exact key its immediate is: the words from
/// [`ImmediateSite::word`] on (two for `iconst` and `f64const`, low half
/// first; one for `f32const`) are its raw bits, and nothing else of the key
/// depends on them. The similar-function shapes ([`crate::similar`]) mask
/// these words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmediateSite {
    /// The position of the immediate's low word in [`Fingerprint::key`].
    pub word: u32,
    /// The instruction.
    pub inst: Inst,
}

/// The facts of the key in [`Fingerprinter::out`] beside its words.
#[derive(Default)]
struct LastKey {
    instructions: u32,
    template_len: u32,
    hashes: KeyHashes,
    named_values_exist: bool,
}

/// What one walk of a function found: its key, still in the
/// [`Fingerprinter`]'s scratch memory, and the facts beside it. Valid until
/// the next walk (it borrows the fingerprinter).
#[derive(Clone, Copy)]
pub struct Walk<'a> {
    key: BorrowedFingerprint<'a>,
    names: &'a [SymbolName],
    address_taken: &'a [bool],
    observes_own_frame: bool,
    key_is_unique: bool,
    named_values_exist: bool,
    constant_sites: &'a [ImmediateSite],
}

impl<'a> Walk<'a> {
    /// The exact key, borrowed: enough to look the function up in a
    /// [`DedupCache`](crate::DedupCache), which then allocates nothing.
    pub fn key(&self) -> BorrowedFingerprint<'a> {
        self.key
    }

    /// The exact key, owned.
    pub fn fingerprint(&self) -> Fingerprint {
        self.key.to_fingerprint()
    }

    /// The function's [`Template`], copying only its words.
    pub fn template(&self) -> Template {
        self.key.to_template()
    }

    /// Number of instructions the walk encoded (reachable, in the layout).
    pub fn instructions(&self) -> u32 {
        self.key.instructions()
    }

    /// The user and test-case names of the function, in slot order: slot
    /// `i` of its [template](Walk::template) is `names()[i]`. Distinct
    /// names have distinct slots.
    pub fn names(&self) -> &'a [SymbolName] {
        self.names
    }

    /// For each slot of [`Walk::names`], whether the function uses the name
    /// as data (takes a function's address with `func_addr`, or reads a
    /// symbol's address through a global value) rather than only calling
    /// it. Only reachable uses count.
    pub fn address_taken(&self) -> &'a [bool] {
        self.address_taken
    }

    /// Whether a reachable instruction of the function observes the
    /// function's own frame: reads the frame pointer, stack pointer or
    /// return address (`get_frame_pointer`, `get_stack_pointer`,
    /// `get_return_address`), switches stacks (`stack_switch`), or catches
    /// exceptions (`try_call`, `try_call_indirect`). A frame put between
    /// the function and its caller changes what such a function sees.
    pub fn observes_own_frame(&self) -> bool {
        self.observes_own_frame
    }

    /// Whether the key holds a number no other key of this process has,
    /// drawn anew each walk, so that the function is the duplicate of
    /// nothing: its constant pool maps bytes to handles otherwise than
    /// setting its handles in order would (`ConstantPool::entries_mut` can
    /// leave it so), or two of its reachable instructions share an operand
    /// list, which the mid-end rewrites in place. Another process may draw
    /// the same number, so such a function's code must come from compiling
    /// it, never from a code store.
    pub fn key_is_unique(&self) -> bool {
        self.key_is_unique
    }

    /// Whether the walk encoded every instruction the function holds (all
    /// are in reachable blocks: as many as the function holds were met,
    /// each in the block the layout says it is in, each block once) and met
    /// no value, block, jump table or exception table they name that is
    /// not in its table: their arguments, every entry of their jump tables
    /// and exception tables, and the tables' contexts. Then every value
    /// lookup compiling makes for the instructions' sake finds its value,
    /// which is the half of the check of a function defined without
    /// compiling it that reads every instruction (see
    /// `module/aliases.rs`); `false` says nothing.
    pub fn named_values_exist(&self) -> bool {
        self.named_values_exist
    }

    /// Every reachable `iconst`, `f32const` and `f64const` instruction, in
    /// walk order, with the position of its immediate in the exact key.
    /// Recording them is the walk's only work for similar-function merging
    /// (one push per constant); which of them may become parameters is
    /// decided afterwards, from their uses ([`crate::similar::Shaper`]).
    pub fn constant_sites(&self) -> &'a [ImmediateSite] {
        self.constant_sites
    }
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Self::new()
    }
}

impl Fingerprinter {
    /// A fingerprinter with empty scratch memory.
    pub fn new() -> Self {
        Self {
            out: Vec::new(),
            blocks: Numbering::new(),
            values: Numbering::new(),
            sigs: Numbering::new(),
            func_refs: Numbering::new(),
            func_addrs: Numbering::new(),
            global_values: Numbering::new(),
            dynamic_types: Numbering::new(),
            regions: Numbering::new(),
            jump_tables: Numbering::new(),
            exception_tables: Numbering::new(),
            visited: SecondaryMap::new(),
            stack: Vec::new(),
            successors: Vec::new(),
            slot_codes: Vec::new(),
            declarations: Declarations::default(),
            constant_handles: Vec::new(),
            pool_by_handle: false,
            constants: Numbering::new(),
            immediates: Numbering::new(),
            names: Vec::new(),
            address_taken: Vec::new(),
            func_ref_slots: SecondaryMap::with_default(u32::MAX),
            observes_frame: false,
            constant_sites: Vec::new(),
            list_stamps: Vec::new(),
            stamp: 0,
            unique_key: false,
            named_missing: false,
            last: LastKey::default(),
        }
    }

    /// Walks `func`: its key, and what else the walk found (see [`Walk`]).
    pub fn walk(&mut self, func: &Function) -> Walk<'_> {
        let (instructions, template_len) = self.encode(func);
        self.last = LastKey {
            instructions,
            template_len,
            hashes: KeyHashes::of(&self.out, template_len),
            named_values_exist: !self.named_missing
                && instructions as usize == func.dfg.num_insts(),
        };
        self.last_walk()
    }

    /// The canonical fingerprint of `func` (see the module docs of
    /// [`crate::fingerprint`] for what it contains): [`Walk::fingerprint`]
    /// of [`Fingerprinter::walk`].
    pub fn fingerprint(&mut self, func: &Function) -> Fingerprint {
        self.walk(func).fingerprint()
    }

    /// The last walk's result (before the first, of no function: an empty
    /// key, which no function has), again.
    pub fn last_walk(&self) -> Walk<'_> {
        Walk {
            key: BorrowedFingerprint::new(
                &self.out,
                self.last.instructions,
                self.last.template_len,
                self.last.hashes,
            ),
            names: &self.names,
            address_taken: &self.address_taken,
            observes_own_frame: self.observes_frame,
            key_is_unique: self.unique_key,
            named_values_exist: self.last.named_values_exist,
            constant_sites: &self.constant_sites,
        }
    }

    /// Runs the walk, leaving the key in `self.out`; returns the number of
    /// instructions encoded and the length of the template part of the key.
    fn encode(&mut self, func: &Function) -> (u32, u32) {
        let dfg = &func.dfg;
        self.out.clear();
        self.out.reserve(dfg.num_insts() * 6 + 16);
        self.blocks.reset(dfg.num_blocks());
        self.values.reset(dfg.num_values());
        self.sigs.reset(dfg.signatures.len());
        self.func_refs.reset(dfg.ext_funcs.len());
        self.func_addrs.reset(dfg.ext_funcs.len());
        self.global_values.reset(func.global_values.len());
        self.dynamic_types.reset(dfg.dynamic_types.len());
        self.regions.reset(dfg.alias_regions.len());
        self.jump_tables.reset(dfg.jump_tables.len());
        self.exception_tables.reset(dfg.exception_tables.len());
        self.visited.clear();
        self.visited.resize(dfg.num_blocks());
        self.constants.reset(dfg.constants.len());
        self.immediates.reset(dfg.immediates.len());
        self.constant_handles.clear();
        self.constant_handles
            .extend(dfg.constants.iter().map(|(&handle, _)| handle));
        self.names.clear();
        self.address_taken.clear();
        self.func_ref_slots.clear();
        self.declarations.clear();
        self.observes_frame = false;
        self.unique_key = false;
        self.named_missing = false;
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.list_stamps.fill(0);
            self.stamp = 1;
        }
        let lists = dfg.value_lists.capacity();
        if self.list_stamps.len() < lists {
            self.list_stamps.resize(lists, 0);
        }
        self.constant_sites.clear();

        // 1. Signature; 2. stack limit and value labels; 3. frame layout
        // and constant pool.
        encode_signature(&mut self.out, &func.signature);
        match func.stack_limit {
            None => self.out.push(0),
            Some(gv) => {
                self.out.push(1);
                self.global_value(func, gv);
            }
        }
        // Collecting value labels for debug info keeps the `vmctx`
        // parameter alive to the end (`Lower::gen_return`), which changes
        // register allocation.
        self.out.push(u32::from(dfg.values_labels.is_some()));
        self.frame_layout(func);
        self.constant_pool(func);

        // 4. Reachable blocks in DFS pre-order.
        let mut instructions = 0u32;
        self.stack.clear();
        if let Some(entry) = func.layout.entry_block() {
            self.block_ref(entry);
            self.stack.push(entry);
        }
        while let Some(block) = self.stack.pop() {
            if self.visited[block] {
                continue;
            }
            self.visited[block] = true;
            self.successors.clear();
            self.block_header(func, block);
            // `first_inst` and `next_inst` rather than `block_insts`, whose
            // iterator is not inlined (a twentieth of the walk).
            let mut next = func.layout.first_inst(block);
            while let Some(inst) = next {
                instructions += 1;
                // An instruction in two blocks' lists (which only the
                // verifier and Cranelift's debug assertions reject) would
                // be counted twice here: the count then proves nothing
                // about the instructions encoded (see
                // `Walk::named_values_exist`).
                self.named_missing |= func.layout.inst_block(inst) != Some(block);
                // The next instruction first: its load is then under way
                // while this one is encoded.
                next = func.layout.next_inst(inst);
                self.instruction(func, inst);
            }
            // Push in reverse so the first destination is visited next.
            self.stack.extend(self.successors.iter().rev());
        }
        self.out.push(u32::MAX); // End of blocks.
        self.unused_declarations(func);
        if self.unique_key {
            static UNIQUE: AtomicU64 = AtomicU64::new(0);
            self.out.push(1);
            self.imm64(UNIQUE.fetch_add(1, Ordering::Relaxed) as i64);
        } else {
            self.out.push(0);
        }

        // 10. The names behind the name slots, in slot order, after the
        // template part of the key.
        let template_len = self.out.len() as u32;
        encode_names(&mut self.out, &self.names);

        (instructions, template_len)
    }

    /// What Cranelift reads of the tables it handles whole, beyond what
    /// reachable instructions name (item 9 of the key).
    ///
    /// The signatures and dynamic types no reachable instruction uses, as
    /// sets of contents, sorted and without repeats: Cranelift computes an
    /// ABI for every declared signature (`SigSet::new` in
    /// `machinst/abi.rs`) and makes every dynamic type concrete
    /// (`Callee::new`, which panics on a base type too wide), so one it
    /// cannot handle fails the compile while the verifier accepts the
    /// function. Otherwise, signatures are read only for that, and
    /// dynamic types only for that and for the size of a spill slot (the
    /// largest over every declared dynamic type, `Callee::get_spillslot_size`),
    /// which only their base types decide: so which there are (as a set of
    /// contents), not their order or count, changes the code. Left out, since they succeed whenever the function
    /// compiles: a signature equal to the function's own or to a used one,
    /// or empty (no parameters or returns: the CLIF parser fills gaps in
    /// `sigN` numbering with such), whose lowering reads nothing but its
    /// calling convention; and a dynamic type whose base type a used one
    /// has (the parser fills gaps in `dtN` with copies). (The constant
    /// pool, also handled whole, is in item 3 of the key: see
    /// [`Fingerprinter::constant_pool`].)
    fn unused_declarations(&mut self, func: &Function) {
        let dfg = &func.dfg;
        let mut signatures: Vec<Vec<u32>> = Vec::new();
        if dfg.signatures.keys().any(|sig| self.sigs.seen[sig] == 0) {
            let (used, unused): (Vec<_>, Vec<_>) = dfg
                .signatures
                .iter()
                .partition(|&(sig, _)| self.sigs.seen[sig] != 0);
            let lowered: HashSet<&Signature> = std::iter::once(&func.signature)
                .chain(used.into_iter().map(|(_, signature)| signature))
                .collect();
            let conventions: HashSet<CallConv> = lowered.iter().map(|s| s.call_conv).collect();
            for (_, signature) in unused {
                // An empty signature lowers in any calling convention but
                // `winch` (which riscv64 and s390x assert against in
                // `compute_arg_locs`); in that one, if a lowered one has it.
                let empty = signature.params.is_empty() && signature.returns.is_empty();
                let known = lowered.contains(signature)
                    || (empty
                        && (signature.call_conv != CallConv::Winch
                            || conventions.contains(&signature.call_conv)));
                if !known {
                    let mut words = Vec::new();
                    encode_signature(&mut words, signature);
                    signatures.push(words);
                }
            }
            signatures.sort_unstable();
            signatures.dedup();
        }
        self.out.push(signatures.len() as u32);
        for words in &signatures {
            self.out.extend_from_slice(words);
        }
        let mut types: Vec<u32> = Vec::new();
        if dfg
            .dynamic_types
            .keys()
            .any(|dt| self.dynamic_types.seen[dt] == 0)
        {
            let used: HashSet<Type> = dfg
                .dynamic_types
                .iter()
                .filter(|&(dt, _)| self.dynamic_types.seen[dt] != 0)
                .map(|(_, data)| data.base_vector_ty)
                .collect();
            types = dfg
                .dynamic_types
                .iter()
                .filter(|&(dt, data)| {
                    self.dynamic_types.seen[dt] == 0 && !used.contains(&data.base_vector_ty)
                })
                .map(|(_, data)| type_word(data.base_vector_ty))
                .collect();
            types.sort_unstable();
            types.dedup();
        }
        self.out.push(types.len() as u32);
        self.out.extend_from_slice(&types);
    }

    /// The constant pool (after the frame in the key): one word saying
    /// whether it is *plain*: its handles exactly 0 to its length, their
    /// bytes all different, and its map from bytes to handles what setting
    /// each handle in order makes. If it is not, the word is 1 and the
    /// pool follows (its length, then every handle with its bytes), and
    /// each use of a constant is its handle (see
    /// [`Fingerprinter::constant`]); if its map from bytes to handles is
    /// not even the one setting each handle in order makes, the word is 2
    /// and the key is unique ([`Walk::key_is_unique`]), so that the function
    /// is the duplicate of none.
    ///
    /// The mid-end adds constants while compiling (`ConstantPool::insert`,
    /// for a `splat` of a constant say): if the pool's map holds those
    /// bytes, it takes their handle there (the last one set with them,
    /// used or not; `entries_mut` changes bytes without the map), and if
    /// not, the handle numbered as the pool's length, asserting that it is
    /// new. In a plain pool, the new handle is always new, and the handle
    /// taken is the one with those bytes, the one a use of them already
    /// names if any: which handles exist, and their numbers, change
    /// nothing. In a pool set in handle order, the map follows from the
    /// handles and their bytes, which the key then holds; in another, the
    /// map holds what the key cannot.
    fn constant_pool(&mut self, func: &Function) {
        let pool = &func.dfg.constants;
        self.pool_by_handle = false;
        if pool.len() == 0 {
            self.out.push(0);
            return;
        }
        // `constant_handles` holds the pool's handles in order.
        let dense = self
            .constant_handles
            .last()
            .is_none_or(|last| last.index() + 1 == self.constant_handles.len());
        let distinct = self.constant_handles.len() < 2 || {
            let mut seen = HashSet::with_capacity(self.constant_handles.len());
            pool.iter().all(|(_, data)| seen.insert(data.as_slice()))
        };
        let set_in_order = pool_set_in_order(pool);
        if dense && distinct && set_in_order {
            self.out.push(0);
            return;
        }
        self.pool_by_handle = true;
        self.out.push(if set_in_order { 1 } else { 2 });
        self.out.push(pool.len() as u32);
        for (handle, data) in pool.iter() {
            self.out.push(handle.as_u32());
            encode_bytes(&mut self.out, data.as_slice());
        }
        self.unique_key |= !set_in_order;
    }

    fn block_header(&mut self, func: &Function, block: Block) {
        let params = func.dfg.block_params(block);
        let cold = if func.layout.is_cold(block) {
            COLD_BLOCK
        } else {
            0
        };
        self.out.push(params.len() as u32 | cold);
        for &param in params {
            self.value_def(func, param);
        }
    }

    /// A block reference: its serial number. New blocks are recognised by a
    /// number equal to the count of blocks seen; their contents follow when the
    /// walk reaches them.
    #[inline]
    fn block_ref(&mut self, block: Block) {
        let (n, _) = self.blocks.number(block);
        self.out.push(n);
    }

    /// A value definition (result or block parameter): its type; new values
    /// are numbered implicitly in definition order.
    #[inline]
    fn value_def(&mut self, func: &Function, value: Value) {
        let ty = func.dfg.value_type(value);
        let (n, new) = self.values.number(value);
        if new {
            self.out.push(type_word(ty));
        } else {
            self.out.push(type_word(ty) | ALREADY_NUMBERED);
            self.out.push(n);
        }
    }

    /// A value use: the serial number of its alias-resolved value.
    #[inline(always)]
    fn value_use(&mut self, func: &Function, value: Value) {
        // Fast path: a value (or alias) whose number is already known.
        // Numbers are cached on aliases too, so each alias is resolved once.
        let known = self.values.seen[value];
        if known != 0 {
            self.out.push(known - 1);
        } else {
            self.value_use_first(func, value);
        }
    }

    /// [`Self::value_use`] of an alias or a value not numbered yet.
    #[cold]
    #[inline(never)]
    fn value_use_first(&mut self, func: &Function, value: Value) {
        if !func.dfg.value_is_valid(value) {
            // Only in functions that fail the verifier.
            self.named_missing = true;
            self.out.push(u32::MAX);
            return;
        }
        let resolved = func.dfg.resolve_aliases(value);
        let (n, new) = self.values.number(resolved);
        self.values.seen[value] = n + 1;
        self.out.push(n);
        if new {
            // Used before its definition: only in invalid functions.
            self.out.push(type_word(func.dfg.value_type(resolved)));
        }
    }

    /// Notes a use of the value list with pool index `index` (see
    /// [`list_index`]), a list of operands or of a branch's arguments. The
    /// mid-end rewrites operands in place, through their lists (the
    /// egraph's first pass, `egraph/mod.rs`, and `overwrite_inst_values` in
    /// `egraph/elaborate.rs`), so a list with operands that two uses share
    /// (two instructions, or two destinations of one) is rewritten for
    /// both, and can make the compile fail where separate lists with the
    /// same values do not. The key does not number lists: a function that
    /// shares one gets a key no other has ([`Walk::key_is_unique`]).
    /// (Copying an `InstructionData`, or a jump table without
    /// `deep_clone`, shares lists; `FunctionBuilder` makes a list per
    /// instruction, but jump tables hold the branch destinations they are
    /// given, and translators share argument-less ones, which nothing
    /// rewrites and so are not noted.)
    #[inline]
    fn note_list(&mut self, index: u32) {
        // 0 is the empty list; an index out of the pool is no list.
        if index == 0 {
            return;
        }
        if let Some(stamp) = self.list_stamps.get_mut(index as usize) {
            self.unique_key |= *stamp == self.stamp;
            *stamp = self.stamp;
        }
    }

    /// A variable-length operand list: its length, then the values.
    fn value_list(&mut self, func: &Function, values: &[Value]) {
        self.out.push(values.len() as u32);
        self.values_fixed(func, values);
    }

    /// Operands whose count the opcode fixes: the values only.
    #[inline]
    fn values_fixed(&mut self, func: &Function, values: &[Value]) {
        for &v in values {
            self.value_use(func, v);
        }
    }

    /// A branch destination: block, then its arguments. The block is also a
    /// successor for the DFS.
    fn block_call(&mut self, func: &Function, call: &BlockCall) {
        let pool = &func.dfg.value_lists;
        // Its list holds its block first; only arguments are rewritten.
        if call.args(pool).len() > 0 {
            self.note_list(list_index(call));
        }
        let block = call.block(pool);
        if func.dfg.block_is_valid(block) {
            self.block_ref(block);
            self.successors.push(block);
        } else {
            // Only in functions that fail the verifier.
            self.named_missing = true;
            self.out.push(u32::MAX);
        }
        let args = call.args(pool);
        self.out.push(args.len() as u32);
        for arg in args {
            match arg {
                BlockArg::Value(v) => {
                    self.out.push(0);
                    self.value_use(func, v);
                }
                BlockArg::TryCallRet(i) => self.out.extend([1, i]),
                BlockArg::TryCallExn(i) => self.out.extend([2, i]),
            }
        }
    }

    /// A signature reference: its number among distinct signatures. A
    /// signature seen for the first time is written out in full before
    /// it (see [`Declarations`]).
    fn sig_ref(&mut self, func: &Function, sig: SigRef) -> u32 {
        let known = self.sigs.seen[sig];
        if known != 0 {
            return known - 1;
        }
        // A reference to no signature (only in functions that fail the
        // verifier) is not numbered: its index may be anything.
        let Some(signature) = func.dfg.signatures.get(sig) else {
            return MISSING;
        };
        let content = self.declarations.start(DECLARED_SIGNATURE);
        encode_signature(content, signature);
        let n = self.declarations.intern(&mut self.out);
        self.sigs.seen[sig] = n + 1;
        n
    }

    /// A function reference: its number among distinct declarations (name,
    /// signature, `colocated`, `patchable`), written out in full before it
    /// the first time (see [`Declarations`]).
    fn func_ref(&mut self, func: &Function, func_ref: FuncRef) -> u32 {
        let known = self.func_refs.seen[func_ref];
        if known != 0 {
            return known - 1;
        }
        let Some(ir::ExtFuncData {
            name,
            signature,
            colocated,
            patchable,
        }) = func.dfg.ext_funcs.get(func_ref)
        else {
            // As in `sig_ref`: not numbered.
            return MISSING;
        };
        // The signature first: its definition, if new, precedes this one.
        let sig = self.sig_ref(func, *signature);
        let name = self.external_name(func, name);
        if let Some(slot) = name.slot {
            self.func_ref_slots[func_ref] = slot;
        }
        let content = self.declarations.start(DECLARED_FUNCTION);
        content.extend(name.words);
        content.extend([sig, u32::from(*colocated) | u32::from(*patchable) << 1]);
        let n = self.declarations.intern(&mut self.out);
        self.func_refs.seen[func_ref] = n + 1;
        n
    }

    /// An external name. User and test-case names are written as their slot
    /// (first-use number among distinct names); the names themselves follow
    /// the template part of the key.
    fn external_name(&mut self, func: &Function, name: &ExternalName) -> NameWords {
        let (tag, found) = match name {
            ExternalName::User(r) => match func.params.user_named_funcs().get(*r) {
                Some(user) => (
                    0,
                    self.names
                        .iter()
                        .position(|n| matches!(n, SymbolName::User(u) if u == user))
                        .ok_or_else(|| SymbolName::User(user.clone())),
                ),
                None => {
                    return NameWords {
                        words: [u32::MAX, u32::MAX],
                        slot: None,
                    };
                }
            },
            ExternalName::TestCase(name) => (
                1,
                self.names
                    .iter()
                    .position(|n| matches!(n, SymbolName::TestCase(t) if **t == *name.raw()))
                    .ok_or_else(|| SymbolName::TestCase(name.raw().into())),
            ),
            ExternalName::LibCall(libcall) => {
                return NameWords {
                    words: [2, *libcall as u32],
                    slot: None,
                };
            }
            ExternalName::KnownSymbol(sym) => {
                return NameWords {
                    words: [3, *sym as u32],
                    slot: None,
                };
            }
        };
        let slot = found.unwrap_or_else(|new| {
            self.names.push(new);
            self.address_taken.push(false);
            self.names.len() - 1
        }) as u32;
        NameWords {
            words: [tag, slot],
            slot: Some(slot),
        }
    }

    fn global_value(&mut self, func: &Function, gv: GlobalValue) {
        if !func.global_values.is_valid(gv) {
            // Not numbered, as in `sig_ref`.
            self.out.push(MISSING);
            return;
        }
        let (n, new) = self.global_values.number(gv);
        self.out.push(n);
        if !new {
            return;
        }
        // `gv` is numbered before its definition is written, so a (verifier-
        // rejected) cycle of global values ends here instead of recursing.
        let Some(data) = func.global_values.get(gv) else {
            self.out.push(u32::MAX);
            return;
        };
        match data {
            GlobalValueData::VMContext => self.out.push(0),
            GlobalValueData::Load {
                base,
                offset,
                global_type,
                flags,
            } => {
                self.out.push(1);
                self.global_value(func, *base);
                self.out
                    .extend([offset32(*offset), type_word(*global_type)]);
                self.mem_flags(func, *flags);
            }
            GlobalValueData::IAddImm {
                base,
                offset,
                global_type,
            } => {
                self.out.push(2);
                self.global_value(func, *base);
                self.imm64(offset.bits());
                self.out.push(type_word(*global_type));
            }
            GlobalValueData::Symbol {
                name,
                offset,
                colocated,
                tls,
            } => {
                self.out.push(3);
                let name = self.external_name(func, name);
                if let Some(slot) = name.slot {
                    self.address_taken[slot as usize] = true;
                }
                self.out.extend(name.words);
                self.imm64(offset.bits());
                self.out.push(u32::from(*colocated) | u32::from(*tls) << 1);
            }
            GlobalValueData::DynScaleTargetConst { vector_type } => {
                self.out.extend([4, type_word(*vector_type)]);
            }
        }
    }

    /// The frame (item 3 of the key): sized stack slots in index order,
    /// then dynamic stack slots in index order, the order Cranelift lays
    /// them out in
    /// (`Callee::new` in `machinst/abi.rs`: each slot starts where the
    /// previous one ended, rounded up to its alignment and at least the
    /// word size). Unused slots are in it: they still move the slots
    /// after them and enlarge the frame, which changes addresses and where
    /// a stack-limit check or probe traps.
    ///
    /// A slot of size 0 and alignment 1 (the CLIF parser makes one for
    /// each gap in `ssN` numbering) moves nothing: its start is rounded up
    /// to the word size, as the next slot's start and the frame's end are
    /// anyway. It is left out; if an instruction uses it, the use is
    /// written as the number of slots before it (its address is the end
    /// of the slots before it rounded up to the word size, which those
    /// slots, all in the key, fix).
    fn frame_layout(&mut self, func: &Function) {
        self.slot_codes.clear();
        let count_at = self.out.len();
        self.out.push(0);
        let mut laid_out = 0u32;
        for data in func.sized_stack_slots.values() {
            if stack_slot_is_empty(data) {
                self.slot_codes.push(EMPTY_SLOT | laid_out);
            } else {
                self.slot_codes.push(laid_out);
                self.out.extend(stack_slot_words(data));
                laid_out += 1;
            }
        }
        self.out[count_at] = laid_out;
        self.out.push(func.dynamic_stack_slots.len() as u32);
        for &ir::DynamicStackSlotData { kind, dyn_ty } in func.dynamic_stack_slots.values() {
            self.out.push(kind as u32);
            self.dynamic_type(func, dyn_ty);
        }
    }

    /// A use of a sized stack slot: its place in the frame layout.
    fn stack_slot(&mut self, slot: StackSlot) {
        let code = self.slot_codes.get(slot.index()).copied();
        self.out.push(code.unwrap_or(u32::MAX));
    }

    /// A use of a dynamic stack slot: its index, which is its place in the
    /// frame layout (every dynamic slot is in it).
    fn dynamic_slot(&mut self, func: &Function, slot: DynamicStackSlot) {
        let valid = func.dynamic_stack_slots.is_valid(slot);
        self.out
            .push(if valid { slot.index() as u32 } else { u32::MAX });
    }

    fn dynamic_type(&mut self, func: &Function, dt: DynamicType) {
        if !func.dfg.dynamic_types.is_valid(dt) {
            // Not numbered, as in `sig_ref`.
            self.out.push(MISSING);
            return;
        }
        let (n, new) = self.dynamic_types.number(dt);
        self.out.push(n);
        if !new {
            return;
        }
        match func.dfg.dynamic_types.get(dt) {
            Some(&ir::DynamicTypeData {
                base_vector_ty,
                dynamic_scale,
            }) => {
                self.out.push(type_word(base_vector_ty));
                self.global_value(func, dynamic_scale);
            }
            None => self.out.push(u32::MAX),
        }
    }

    /// Memory flags by their data, never by their interned index.
    fn mem_flags(&mut self, func: &Function, flags: MemFlags) {
        if !func.dfg.mem_flags.is_valid(flags) {
            self.out.push(u32::MAX);
            return;
        }
        let data = func.dfg.mem_flags[flags];
        let endianness = match data.explicit_endianness() {
            None => 0,
            Some(Endianness::Little) => 1,
            Some(Endianness::Big) => 2,
        };
        let trap = data.trap_code().map_or(0, |t| u32::from(t.as_raw().get()));
        self.out.push(
            endianness
                | u32::from(data.aligned()) << 2
                | u32::from(data.readonly()) << 3
                | u32::from(data.can_move()) << 4
                | trap << 8,
        );
        debug_assert_eq!(
            data,
            rebuild_mem_flags(&data),
            "a memory flag is missing from the fingerprint"
        );
        match data.alias_region() {
            None => self.out.push(0),
            Some(region) if !func.dfg.alias_regions.is_valid(region) => {
                // Not numbered, as in `sig_ref`.
                self.out.push(MISSING);
            }
            Some(region) => {
                let (n, new) = self.regions.number(region);
                self.out.push(n + 1);
                if new {
                    // The description is only for printing CLIF.
                    let ir::AliasRegionData {
                        user_id,
                        description: _,
                    } = &func.dfg.alias_regions[region];
                    self.out.push(*user_id);
                }
            }
        }
    }

    fn bytes(&mut self, bytes: &[u8]) {
        encode_bytes(&mut self.out, bytes);
    }

    /// A constant-pool or `dfg.immediates` handle numbered `n` (`new` on
    /// its first use; `data` its bytes, if it exists): the number, and the
    /// bytes the first time. By identity as well as by value: the mid-end
    /// merges two pure instructions only if they name the same handle, and
    /// the x86-64 backend emits one pool constant per handle (`vcode.rs`),
    /// so two handles of equal bytes do not compile as one.
    fn constant(&mut self, n: u32, new: bool, data: Option<&ConstantData>) {
        let Some(data) = data else {
            self.out.push(u32::MAX);
            return;
        };
        self.out.push(n);
        if new {
            self.bytes(data.as_slice());
        }
    }

    /// Records that the immediate of constant `inst` is written next.
    #[inline]
    fn constant_site(&mut self, inst: Inst) {
        self.constant_sites.push(ImmediateSite {
            word: self.out.len() as u32,
            inst,
        });
    }

    #[inline]
    fn imm64(&mut self, bits: i64) {
        self.out.extend([bits as u32, (bits >> 32) as u32]);
    }

    /// One instruction: a word with opcode, result count and stack-map flag;
    /// result types; then the fields of its format (for calls, followed by
    /// their stack map entries, if any).
    fn instruction(&mut self, func: &Function, inst: Inst) {
        let dfg = &func.dfg;
        let data = &dfg.insts[inst];
        let results = dfg.inst_results(inst);
        let head = self.out.len();
        self.out
            .push(data.opcode() as u32 | (results.len() as u32) << 16);
        for &r in results {
            self.value_def(func, r);
        }
        self.instruction_data(func, inst, data, head);
    }

    /// The user stack map entries of `inst` (opcode `opcode`), if it has
    /// any: flagged in its head word, at `head`, then listed. Only
    /// safepoints (calls and `stack_switch`) can have entries
    /// (`DataFlowGraph` asserts it when they are added), so only the
    /// formats of safepoints call this; the lookup is a tree search, so
    /// only safepoints look.
    fn stack_map(&mut self, func: &Function, inst: Inst, opcode: Opcode, head: usize) {
        if !opcode.is_safepoint() {
            return;
        }
        let Some(entries) = func.dfg.user_stack_map_entries(inst) else {
            return;
        };
        self.out[head] |= HAS_STACK_MAP;
        self.out.push(entries.len() as u32);
        for &ir::UserStackMapEntry { ty, slot, offset } in entries {
            self.out.push(type_word(ty));
            self.stack_slot(slot);
            self.out.push(offset);
        }
    }

    /// The fields of `data`, the instruction `inst` whose head word is at
    /// `head`.
    fn instruction_data(
        &mut self,
        func: &Function,
        inst: Inst,
        data: &InstructionData,
        head: usize,
    ) {
        let dfg = &func.dfg;
        let pool = &dfg.value_lists;
        match *data {
            InstructionData::AtomicCas {
                args,
                flags,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.mem_flags(func, flags);
            }
            InstructionData::AtomicRmw {
                args,
                flags,
                op,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.mem_flags(func, flags);
                self.out.push(op as u32);
            }
            InstructionData::Binary { args, opcode: _ } => self.values_fixed(func, &args),
            InstructionData::BinaryImm8 {
                arg,
                imm,
                opcode: _,
            } => {
                self.value_use(func, arg);
                self.out.push(u32::from(imm));
            }
            InstructionData::BranchTable {
                arg,
                table,
                opcode: _,
            } => {
                self.value_use(func, arg);
                match dfg.jump_tables.get(table) {
                    Some(jt) => {
                        let (n, new) = self.jump_tables.number(table);
                        self.out.push(n);
                        self.branch_table(func, jt.all_branches(), new);
                    }
                    None => {
                        self.named_missing = true;
                        self.out.push(u32::MAX);
                    }
                }
            }
            InstructionData::Brif {
                arg,
                blocks,
                opcode: _,
            } => {
                self.value_use(func, arg);
                self.block_call(func, &blocks[0]);
                self.block_call(func, &blocks[1]);
            }
            InstructionData::Call {
                opcode,
                args,
                func_ref,
            } => {
                let callee = self.func_ref(func, func_ref);
                self.out.push(callee);
                self.note_list(list_index(&args));
                self.value_list(func, args.as_slice(pool));
                self.stack_map(func, inst, opcode, head);
            }
            InstructionData::CallIndirect {
                opcode,
                args,
                sig_ref,
            } => {
                let sig = self.sig_ref(func, sig_ref);
                self.out.push(sig);
                self.note_list(list_index(&args));
                self.value_list(func, args.as_slice(pool));
                self.stack_map(func, inst, opcode, head);
            }
            InstructionData::CondTrap {
                arg,
                code,
                opcode: _,
            } => {
                self.value_use(func, arg);
                self.out.push(u32::from(code.as_raw().get()));
            }
            InstructionData::DynamicStackAddr {
                dynamic_stack_slot,
                opcode: _,
            } => self.dynamic_slot(func, dynamic_stack_slot),
            InstructionData::ExceptionHandlerAddress {
                block,
                imm,
                opcode: _,
            } => {
                if func.dfg.block_is_valid(block) {
                    self.block_ref(block);
                } else {
                    self.out.push(u32::MAX);
                }
                self.imm64(imm.bits());
            }
            InstructionData::FloatCompare {
                args,
                cond,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.out.push(cond as u32);
            }
            InstructionData::FuncAddr {
                func_ref,
                opcode: _,
            } => {
                // By content and by identity: `func_addr` is pure, and the
                // mid-end merges two of them only if they name the same
                // `FuncRef` (see the module docs).
                let callee = self.func_ref(func, func_ref);
                let identity = if func.dfg.ext_funcs.is_valid(func_ref) {
                    self.func_addrs.number(func_ref).0
                } else {
                    MISSING
                };
                self.out.extend([callee, identity]);
                if let Some(taken) = self
                    .address_taken
                    .get_mut(self.func_ref_slots[func_ref] as usize)
                {
                    *taken = true;
                }
            }
            InstructionData::IntAddTrap {
                args,
                code,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.out.push(u32::from(code.as_raw().get()));
            }
            InstructionData::IntCompare {
                args,
                cond,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.out.push(cond as u32);
            }
            InstructionData::Jump {
                destination,
                opcode: _,
            } => self.block_call(func, &destination),
            InstructionData::Load {
                arg,
                flags,
                offset,
                opcode: _,
            } => {
                self.value_use(func, arg);
                self.mem_flags(func, flags);
                self.out.push(offset32(offset));
            }
            InstructionData::LoadNoOffset {
                arg,
                flags,
                opcode: _,
            } => {
                self.value_use(func, arg);
                self.mem_flags(func, flags);
            }
            InstructionData::MultiAry { args, opcode: _ } => {
                self.note_list(list_index(&args));
                self.value_list(func, args.as_slice(pool));
            }
            InstructionData::NullAry { opcode } => {
                if matches!(
                    opcode,
                    Opcode::GetFramePointer | Opcode::GetStackPointer | Opcode::GetReturnAddress
                ) {
                    self.observes_frame = true;
                }
            }
            InstructionData::Shuffle {
                args,
                imm,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                let data = dfg.immediates.get(imm);
                let (n, new) = match data {
                    Some(_) => self.immediates.number(imm),
                    None => (u32::MAX, false),
                };
                self.constant(n, new, data);
            }
            InstructionData::StackAddr {
                stack_slot,
                offset,
                opcode: _,
            } => {
                self.stack_slot(stack_slot);
                self.out.push(offset32(offset));
            }
            InstructionData::Store {
                args,
                flags,
                offset,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.mem_flags(func, flags);
                self.out.push(offset32(offset));
            }
            InstructionData::StoreNoOffset {
                args,
                flags,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.mem_flags(func, flags);
            }
            InstructionData::Ternary { opcode, args } => {
                self.observes_frame |= opcode == Opcode::StackSwitch;
                self.values_fixed(func, &args);
                // `stack_switch` is a safepoint.
                self.stack_map(func, inst, opcode, head);
            }
            InstructionData::TernaryImm8 {
                args,
                imm,
                opcode: _,
            } => {
                self.values_fixed(func, &args);
                self.out.push(u32::from(imm));
            }
            InstructionData::Trap { code, opcode: _ } => {
                self.out.push(u32::from(code.as_raw().get()));
            }
            InstructionData::TryCall {
                opcode,
                args,
                func_ref,
                exception,
            } => {
                self.observes_frame = true;
                let callee = self.func_ref(func, func_ref);
                self.out.push(callee);
                self.note_list(list_index(&args));
                self.value_list(func, args.as_slice(pool));
                self.exception_table(func, exception);
                self.stack_map(func, inst, opcode, head);
            }
            InstructionData::TryCallIndirect {
                opcode,
                args,
                exception,
            } => {
                self.observes_frame = true;
                self.note_list(list_index(&args));
                self.value_list(func, args.as_slice(pool));
                self.exception_table(func, exception);
                self.stack_map(func, inst, opcode, head);
            }
            InstructionData::Unary { arg, opcode: _ } => self.value_use(func, arg),
            InstructionData::UnaryConst {
                constant_handle,
                opcode: _,
            } => {
                // `ConstantPool::get` panics on a missing handle; look first.
                let present = self
                    .constant_handles
                    .binary_search(&constant_handle)
                    .is_ok();
                let data = present.then(|| dfg.constants.get(constant_handle));
                if self.pool_by_handle {
                    // The pool, whole, is in the key already, and says
                    // whether the handle is in it.
                    self.out.push(constant_handle.as_u32());
                } else {
                    // A missing handle is not numbered (it could be any
                    // size).
                    let (n, new) = match data {
                        Some(_) => self.constants.number(constant_handle),
                        None => (u32::MAX, false),
                    };
                    self.constant(n, new, data);
                }
            }
            InstructionData::UnaryGlobalValue {
                global_value,
                opcode: _,
            } => {
                self.global_value(func, global_value);
            }
            InstructionData::UnaryIeee16 { imm, opcode: _ } => self.out.push(u32::from(imm.bits())),
            InstructionData::UnaryIeee32 { imm, opcode } => {
                if opcode == Opcode::F32const {
                    self.constant_site(inst);
                }
                self.out.push(imm.bits());
            }
            InstructionData::UnaryIeee64 { imm, opcode } => {
                if opcode == Opcode::F64const {
                    self.constant_site(inst);
                }
                self.imm64(imm.bits() as i64);
            }
            InstructionData::UnaryImm { imm, opcode } => {
                if opcode == Opcode::Iconst {
                    self.constant_site(inst);
                }
                self.imm64(imm.bits());
            }
        }
    }

    /// A table of branch destinations (a jump table's entries, an
    /// exception table's targets): on its first use (`new`), its length and
    /// every destination; on a later one (the table is shared) nothing more,
    /// but its blocks are successors all the same.
    fn branch_table(&mut self, func: &Function, calls: &[BlockCall], new: bool) {
        if new {
            self.out.push(calls.len() as u32);
            for call in calls {
                self.block_call(func, call);
            }
            return;
        }
        let pool = &func.dfg.value_lists;
        self.successors.extend(
            calls
                .iter()
                .map(|call| call.block(pool))
                .filter(|&block| func.dfg.block_is_valid(block)),
        );
    }

    /// An exception table: its number by first use (see
    /// [`Fingerprinter::branch_table`]), then, on its first use, its
    /// signature, normal return and items.
    fn exception_table(&mut self, func: &Function, table: ir::ExceptionTable) {
        let Some(et) = func.dfg.exception_tables.get(table) else {
            self.named_missing = true;
            self.out.push(u32::MAX);
            return;
        };
        let (n, new) = self.exception_tables.number(table);
        self.out.push(n);
        if !new {
            self.branch_table(func, et.all_branches(), false);
            return;
        }
        let sig = self.sig_ref(func, et.signature());
        self.out.push(sig);
        self.block_call(func, et.normal_return());
        let items = et.items();
        for item in items {
            match item {
                ExceptionTableItem::Tag(tag, call) => {
                    self.out.extend([0, tag.as_u32()]);
                    self.block_call(func, &call);
                }
                ExceptionTableItem::Default(call) => {
                    self.out.push(1);
                    self.block_call(func, &call);
                }
                ExceptionTableItem::Context(v) => {
                    self.out.push(2);
                    self.value_use(func, v);
                }
            }
        }
        self.out.push(3); // End of items.
    }
}

/// The pool index of a value list, which is its identity: the only field of
/// an `EntityList`, and what its derived `Hash` writes (a `BlockCall`'s
/// derived `Hash` writes its list's). Cranelift keeps the field private.
fn list_index(list: &impl Hash) -> u32 {
    /// A hasher that keeps the last `u32` written to it.
    struct LastU32(u32);
    impl Hasher for LastU32 {
        fn finish(&self) -> u64 {
            u64::from(self.0)
        }
        fn write(&mut self, _: &[u8]) {}
        fn write_u32(&mut self, i: u32) {
            self.0 = i;
        }
    }
    let mut index = LastU32(0);
    list.hash(&mut index);
    index.0
}

/// Whether `pool`'s map from bytes to handles is the one setting each of
/// its handles in order makes (see [`Fingerprinter::constant_pool`]).
fn pool_set_in_order(pool: &ConstantPool) -> bool {
    let mut in_order = ConstantPool::new();
    for (&handle, data) in pool.iter() {
        in_order.set(handle, data.clone());
    }
    in_order == *pool
}

/// A signature: calling convention, then parameters and returns.
pub(super) fn encode_signature(out: &mut Vec<u32>, sig: &Signature) {
    let Signature {
        params,
        returns,
        call_conv,
    } = sig;
    out.push(*call_conv as u32);
    out.push(params.len() as u32);
    for p in params {
        encode_abi_param(out, p);
    }
    out.push(returns.len() as u32);
    for p in returns {
        encode_abi_param(out, p);
    }
}

fn encode_abi_param(out: &mut Vec<u32>, p: &AbiParam) {
    let &AbiParam {
        value_type,
        purpose,
        extension,
    } = p;
    let (purpose, size) = match purpose {
        ArgumentPurpose::Normal => (0, 0),
        ArgumentPurpose::StructArgument(size) => (1, size),
        ArgumentPurpose::StructReturn => (2, 0),
        ArgumentPurpose::VMContext => (3, 0),
    };
    out.push(type_word(value_type) | (extension as u32) << 16 | purpose << 20);
    if purpose == 1 {
        out.push(size);
    }
}

/// What an external name writes into the key, and its name slot if it
/// has one.
struct NameWords {
    words: [u32; 2],
    slot: Option<u32>,
}

/// The names section of a key: the count, then each name (`User` by
/// namespace and index, test-case names by their bytes).
pub(crate) fn encode_names(out: &mut Vec<u32>, names: &[SymbolName]) {
    out.push(names.len() as u32);
    for name in names {
        match name {
            SymbolName::User(ir::UserExternalName { namespace, index }) => {
                out.extend([0, *namespace, *index]);
            }
            SymbolName::TestCase(name) => {
                out.push(1);
                encode_bytes(out, name);
            }
        }
    }
}

/// Bytes as their length, then little-endian words (the last one padded
/// with zeros).
fn encode_bytes(out: &mut Vec<u32>, bytes: &[u8]) {
    out.push(bytes.len() as u32);
    for chunk in bytes.chunks(4) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        out.push(u32::from_le_bytes(word));
    }
}

/// A sized stack slot's kind, size, alignment and key.
fn stack_slot_words(data: &ir::StackSlotData) -> [u32; 6] {
    let &ir::StackSlotData {
        kind,
        size,
        align_shift,
        key,
    } = data;
    let bits = key.map_or(0, |k| k.bits());
    [
        kind as u32,
        size,
        u32::from(align_shift),
        u32::from(key.is_some()),
        bits as u32,
        (bits >> 32) as u32,
    ]
}

/// Whether a sized stack slot has size 0 and alignment 1, so that it
/// moves nothing in the frame (see [`Fingerprinter::frame_layout`]).
fn stack_slot_is_empty(data: &ir::StackSlotData) -> bool {
    let &ir::StackSlotData {
        kind: _,
        size,
        align_shift,
        key: _,
    } = data;
    size == 0 && align_shift == 0
}

#[inline]
fn type_word(ty: Type) -> u32 {
    ty.index() as u32
}

#[inline]
fn offset32(offset: Offset32) -> u32 {
    i32::from(offset) as u32
}

/// Rebuilds memory flags from exactly the fields the walk encodes; equal to
/// the original only if no flag is missing from the key.
pub(crate) fn rebuild_mem_flags(data: &ir::MemFlagsData) -> ir::MemFlagsData {
    let mut rebuilt = ir::MemFlagsData::new().with_trap_code(data.trap_code());
    if let Some(e) = data.explicit_endianness() {
        rebuilt = rebuilt.with_endianness(e);
    }
    if data.aligned() {
        rebuilt = rebuilt.with_aligned();
    }
    if data.readonly() {
        rebuilt = rebuilt.with_readonly();
    }
    if data.can_move() {
        rebuilt = rebuilt.with_can_move();
    }
    rebuilt.with_alias_region(data.alias_region())
}
