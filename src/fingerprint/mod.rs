//! Canonical fingerprints of CLIF functions.
//!
//! A [`Fingerprint`] is the result of one linear walk over an
//! [`ir::Function`] in CFG order. It holds a
//! canonical **key**: a sequence of 32-bit words that records every fact about
//! the function that can change what its compiled code does.
//! [`Fingerprinter::walk`] returns it as one [`Walk`], with what else the
//! walk found (the names behind the template's slots, which of them are
//! used as data, whether the function observes its own frame).
//!
//! Each kind of key is its own type: the exact key ([`Fingerprint`]), the
//! [`Template`] (the key without its names) and the [`ErasedConvention`]
//! (the exact key without the function's calling convention), and the
//! [`Shape`] of similar-function merging (the exact key with the
//! immediates of parameterizable constants masked; built by
//! [`crate::similar`] from the walk's [`Walk::constant_sites`]). Keys of
//! different kinds cannot be compared, and only a template can be given
//! names back ([`Template::with_names`]).
//!
//! # What this module guarantees
//!
//! For two functions `f` and `g` that pass the Cranelift verifier:
//!
//! - `key(f) == key(g)` **if and only if** `f` and `g` are the same function up
//!   to the things listed under *ignored* below. Equal keys mean one function
//!   can be compiled in place of the other.
//! - `Ord` is the lexicographic order of the keys, so it is a total order
//!   consistent with `Eq` and `Hash` by construction.
//! - [`Fingerprint::stable_hash`] depends only on the key bytes and a fixed
//!   seed: identical across processes and machines for a given version of
//!   jitfold and of Cranelift (the key format may change with either).
//! - The in-memory hash used by `Hash` is keyed with a per-process random
//!   seed, so crafted inputs cannot force hash collisions in the cache.
//!
//! **Ignored** (not in the key): the function's name, value and block
//! numbers, the layout order of blocks, source locations, the contents of
//! value labels, debug tags, value aliases (resolved before numbering), blocks that are
//! unreachable from the entry block, instructions and values that are not in
//! the layout, declarations (external functions, global values, alias
//! regions) that no reachable instruction uses, stack
//! slots of size 0 and alignment 1 that nothing uses (the CLIF parser
//! creates them for gaps in `ssN` numbering), the index order of side
//! tables other than stack slots, and how many times a signature or an
//! external function is declared (equal declarations are one, but for
//! `func_addr`). Which tables Cranelift reads by index, by identity or by
//! content, with the places in its source that decide it, is in the docs
//! of `walk.rs`.
//!
//! **Included** (each is a checklist item of the walk in `walk.rs`):
//!
//! 1. The signature: parameter and return types, their `ArgumentPurpose` and
//!    `ArgumentExtension`, and the calling convention.
//! 2. `stack_limit`, as a global value, and whether value labels are
//!    collected (that keeps the `vmctx` parameter alive).
//! 3. The frame layout: every sized stack slot (kind, size, alignment, key)
//!    in index order, which is the order Cranelift lays them out in, but for
//!    unused slots of size 0 and alignment 1; then every dynamic stack slot
//!    in index order with its dynamic type. Uses of slots refer to their
//!    place in this list. Then whether the constant pool is plain (its
//!    handles exactly 0 to its length, their bytes all different, its map
//!    from bytes to handles the one setting each handle in order makes),
//!    and if not, its length and every handle with its bytes (and if its
//!    map is not even one setting each handle makes, the key is unique,
//!    see 9): the mid-end adds constants at the handle numbered as the
//!    pool's length, asserting that it is new, and takes the handle the map
//!    gives for bytes the pool holds, used or not.
//! 4. Reachable blocks in DFS pre-order from the entry block, following each
//!    terminator's destinations in order; each block's parameter types and
//!    whether it is marked cold (cold blocks are laid out last).
//! 5. Every instruction of those blocks in layout order: opcode, number and
//!    types of results, operands as serial value numbers, and every immediate
//!    of its `InstructionData` format: `Imm64` and float immediates by their raw
//!    bits (so NaN payloads and `-0.0` are distinct), `Offset32`, `Uimm8`, lane
//!    indices, condition codes, atomic RMW ops, trap codes.
//! 6. Memory flags by their data (endianness, `aligned`, `readonly`,
//!    `can_move`, trap code), never by their interned index; the alias region
//!    by first-use number and its `user_id`.
//! 7. Constant-pool and `dfg.immediates` handles by first-use number, with
//!    their bytes on first use (two handles of equal bytes are not one: the
//!    mid-end and the x86-64 constant pool tell handles apart); in a pool
//!    that is not plain (see 3), by handle.
//! 8. Branch destinations as block serial numbers with their arguments
//!    (`BlockArg::{Value, TryCallRet, TryCallExn}`); jump tables and
//!    exception tables by first-use number, written out on first use (jump
//!    tables entry by entry; exception tables signature, normal return,
//!    tags, defaults and contexts in order): a table two branches share is
//!    not two equal tables (`remove_constant_phis` edits entries in place).
//! 9. Other side tables in first-use order, each written out in full on
//!    its first use: global values with all fields, recursively; dynamic
//!    types; alias regions. Signatures of `SigRef`s and external functions
//!    (name, signature, `colocated`, `patchable`) are numbered by content
//!    in first-use order, so a callee declared twice is one callee; a
//!    `func_addr` also writes which declaration it names, by first use.
//!    After the blocks, the signatures no reachable instruction uses, and
//!    the base types of the dynamic types none uses, each as a sorted set
//!    of contents: Cranelift lowers every declared signature and dynamic
//!    type, and one it cannot lower fails the compile. (Left out are those
//!    that lower whenever the function compiles, such as the placeholders
//!    the CLIF parser makes for gaps in `sigN` and `dtN` numbering; see
//!    `unused_declarations` in `walk.rs`.)
//!    Last, whether the key is unique: a number no other key of the
//!    process has (drawn anew each walk) when the constant pool's map is
//!    one the key cannot hold, or when two reachable instructions share an
//!    operand list, which the mid-end rewrites in place (see
//!    `Walk::key_is_unique`).
//! 10. External names: libcalls and known symbols by variant in place; `User`
//!     and test-case names in place as a *name slot* (their number in
//!     first-use order among distinct names), and after everything else the
//!     list of names in slot order (`User` names by namespace and index,
//!     test-case names by their bytes).
//! 11. User stack map entries of each instruction (type, slot, offset).
//!
//! # Templates
//!
//! The key up to the list of names is the function's **template**
//! ([`Fingerprint::to_template`]). Equal templates mean the functions are the
//! same up to a renaming of their user and test-case names that maps slot
//! `i` of one to slot `i` of the other (a bijection, since distinct names
//! get distinct slots), with everything else about each reference still in
//! the key: the callee's signature, `colocated`, `patchable`, a symbol's
//! offset and `tls`. Cranelift does not look at the value of such a name
//! while compiling, so the machine code of two such functions differs only
//! in the targets of relocations, which the slots map from one to the
//! other ([`Walk::names`]). Libcalls and known symbols are
//! never slots: the compiler itself may emit relocations against them.
//!
//! Enums with data (`InstructionData`, `GlobalValueData`, `ExternalName`,
//! `BlockArg`, `ExceptionTableItem`, `ArgumentPurpose`) are matched
//! exhaustively, with no wildcard arm, so a new Cranelift variant is a compile
//! error. Enums without data (`Opcode`, `CallConv`, condition codes, ...) are
//! encoded by their discriminant, which is distinct per variant by
//! construction.
//!
//! Integer immediates are encoded by their raw stored bits, not masked to the
//! type width: the verifier already rejects out-of-range `iconst`s, and keeping
//! the raw bits means a cache hit is always bit-identical to a function that
//! passed the verifier.
//!
//! Functions that fail the verifier still get a fingerprint (the walk does not
//! rely on dominance or well-formed side tables; the one exception is a cycle
//! of value aliases, on which Cranelift's own alias resolution panics), but
//! the "if and only if" above is only promised for valid functions.

mod declarations;
mod keys;
mod walk;

use cranelift_codegen::ir::{self, ExternalName, Function, UserExternalName, UserExternalNameRef};

pub use keys::{
    BorrowedFingerprint, CanonicalKey, ErasedConvention, Fingerprint, Probe, Shape, Template,
};
use keys::{KeyHashes, process_hasher};
pub(crate) use walk::encode_names;
pub use walk::{Fingerprinter, ImmediateSite, Walk};

/// The version of Cranelift that jitfold is built against (Cargo pins every
/// Cranelift crate to it): the key format and the audit in `walk.rs` are
/// for this version, and messages that name Cranelift name it from here.
pub const CRANELIFT_VERSION: &str = cranelift_module::VERSION;

/// Version of the key format; mixed into the stable hash so that persisted
/// hashes from an older format never match new keys.
pub const KEY_FORMAT_VERSION: u32 = 8;

/// The entries of `func`'s user name table that a declaration refers to
/// (a function reference, or a symbol global value), in declaration order,
/// possibly more than once. An entry no declaration refers to names
/// nothing the function does: an embedder that renames a callee by
/// appending an entry leaves the old one behind.
pub(crate) fn declared_user_names(
    func: &Function,
) -> impl Iterator<Item = (UserExternalNameRef, &UserExternalName)> {
    let named = func.params.user_named_funcs();
    let functions = func.dfg.ext_funcs.values().map(|data| &data.name);
    let symbols = func.global_values.values().filter_map(|gv| match gv {
        ir::GlobalValueData::Symbol { name, .. } => Some(name),
        ir::GlobalValueData::VMContext
        | ir::GlobalValueData::Load { .. }
        | ir::GlobalValueData::IAddImm { .. }
        | ir::GlobalValueData::DynScaleTargetConst { .. } => None,
    });
    functions.chain(symbols).filter_map(move |name| match name {
        ExternalName::User(r) => named.get(*r).map(|user| (*r, user)),
        ExternalName::TestCase(_) | ExternalName::LibCall(_) | ExternalName::KnownSymbol(_) => None,
    })
}

/// A user or test-case external name, as it fills a name slot of a
/// [template](Template).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SymbolName {
    /// `ExternalName::User`, by the value its reference stands for.
    User(UserExternalName),
    /// `ExternalName::TestCase`, by its bytes.
    TestCase(Box<[u8]>),
}

impl SymbolName {
    /// The symbol `name` stands for in `func`, if it is a user or
    /// test-case name (a user name by the value its reference stands for;
    /// `None` for a reference `func` does not declare).
    pub fn of(func: &Function, name: &ExternalName) -> Option<SymbolName> {
        match name {
            ExternalName::User(r) => func
                .params
                .user_named_funcs()
                .get(*r)
                .map(|user| SymbolName::User(user.clone())),
            ExternalName::TestCase(name) => Some(SymbolName::TestCase(name.raw().into())),
            ExternalName::LibCall(_) | ExternalName::KnownSymbol(_) => None,
        }
    }
}
