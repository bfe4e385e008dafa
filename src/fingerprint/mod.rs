//! Canonical fingerprints of CLIF functions.
//!
//! A [`Fingerprint`] is the result of one linear walk over an
//! [`ir::Function`](cranelift_codegen::ir::Function) in CFG order. It holds a
//! canonical **key**: a sequence of 32-bit words that records every fact about
//! the function that can change what its compiled code does.
//!
//! # What this module guarantees
//!
//! For two functions `f` and `g` that pass the Cranelift verifier:
//!
//! - `key(f) == key(g)` **if and only if** `f` and `g` are the same function up
//!   to the things listed under *ignored* below. Equal keys mean one function
//!   can be compiled in place of the other.
//! - `Ord` is the lexicographic order of the keys (fingerprints with the
//!   calling convention erased after all others), so it is a total order
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
//! the layout, declarations (signatures, external functions, global values,
//! alias regions, dynamic types) that no reachable instruction uses, stack
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
//!    place in this list.
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
//!    mid-end and the x86-64 constant pool tell handles apart).
//! 8. Branch destinations as block serial numbers with their arguments
//!    (`BlockArg::{Value, TryCallRet, TryCallExn}`), jump tables entry by
//!    entry, exception tables (signature, normal return, tags, defaults and
//!    contexts in order).
//! 9. Other side tables in first-use order, each written out in full on
//!    its first use: global values with all fields, recursively; dynamic
//!    types; alias regions. Signatures of `SigRef`s and external functions
//!    (name, signature, `colocated`, `patchable`) are numbered by content
//!    in first-use order, so a callee declared twice is one callee; a
//!    `func_addr` also writes which declaration it names, by first use.
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
//! ([`Fingerprint::template`]). Equal templates mean the functions are the
//! same up to a renaming of their user and test-case names that maps slot
//! `i` of one to slot `i` of the other (a bijection, since distinct names
//! get distinct slots), with everything else about each reference still in
//! the key: the callee's signature, `colocated`, `patchable`, a symbol's
//! offset and `tls`. Cranelift does not look at the value of such a name
//! while compiling, so the machine code of two such functions differs only
//! in the targets of relocations, which the slots map from one to the
//! other ([`Fingerprinter::last_names`]). Libcalls and known symbols are
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
mod walk;

use core::cmp::Ordering;
use core::hash::{BuildHasher, Hash, Hasher};
use cranelift_codegen::ir::{Function, UserExternalName};
use std::sync::{Arc, OnceLock};

pub use walk::Fingerprinter;

/// Version of the key format; mixed into the stable hash so that persisted
/// hashes from an older format never match new keys.
pub const KEY_FORMAT_VERSION: u32 = 3;

/// The canonical fingerprint of one function: its key and a keyed hash of it.
///
/// Holds no reference to the function it came from; memory use is the key
/// (a few words per instruction) plus six words. Cloning it, taking its
/// [template](Fingerprint::template) and erasing its calling convention
/// share the key instead of copying it.
#[derive(Clone)]
pub struct Fingerprint {
    /// The exact key of the function; a template's key is a prefix of it.
    words: Arc<[u32]>,
    /// Where this fingerprint's key starts in `words`: 0, or 1 when the
    /// calling convention is erased (it is the first word).
    start: u32,
    /// Where this fingerprint's key ends in `words`.
    len: u32,
    /// Length of the template part of `words`.
    template_len: u32,
    hash: u64,
    /// The hash of the template part, from which `hash` continues.
    template_hash: u64,
    /// The hash of the template part after the calling convention, from
    /// which `template_hash` continues (so that erasing the convention
    /// hashes no word of the body again).
    body_hash: u64,
    instructions: u32,
}

/// A user or test-case external name, as it fills a name slot of a
/// [template](Fingerprint::template).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SymbolName {
    /// `ExternalName::User`, by the value its reference stands for.
    User(UserExternalName),
    /// `ExternalName::TestCase`, by its bytes.
    TestCase(Box<[u8]>),
}

impl Fingerprint {
    /// Fingerprints `func` with a fresh [`Fingerprinter`]. To fingerprint many
    /// functions, keep one `Fingerprinter` and reuse its scratch memory.
    pub fn of(func: &Function) -> Self {
        Fingerprinter::new().fingerprint(func)
    }

    fn from_key(words: &[u32], instructions: u32, template_len: u32) -> Self {
        BorrowedFingerprint {
            words,
            instructions,
            template_len,
            hashes: KeyHashes::of(words, template_len),
        }
        .to_fingerprint()
    }

    /// Whether `borrowed` is this fingerprint (the same key, not erased).
    pub(crate) fn is(&self, borrowed: &BorrowedFingerprint<'_>) -> bool {
        self.hash == borrowed.hashes.hash && self.start == 0 && self.key() == borrowed.words
    }

    /// The fingerprint of this function's *template*: the key without the
    /// names behind its name slots (see the [module docs](self)). Functions
    /// with equal templates compile to the same machine code up to the
    /// targets of relocations against those names. The template of a
    /// template is itself.
    pub fn template(&self) -> Fingerprint {
        Self {
            words: self.words.clone(),
            start: self.start,
            len: self.template_len,
            template_len: self.template_len,
            hash: self.template_hash,
            template_hash: self.template_hash,
            body_hash: self.body_hash,
            instructions: self.instructions,
        }
    }

    /// The exact fingerprint of the function `template` was taken from,
    /// with its names replaced slot for slot by `names` (the same as
    /// fingerprinting that function after renaming those external names,
    /// as long as `names` are distinct). `template` must be a template.
    pub fn with_names(template: &Fingerprint, names: &[SymbolName]) -> Fingerprint {
        debug_assert_eq!(template.len, template.template_len, "not a template");
        debug_assert_eq!(template.start, 0, "calling convention erased");
        let mut words = template.key().to_vec();
        walk::encode_names(&mut words, names);
        Self::from_key(&words, template.instructions, template.template_len)
    }

    /// This fingerprint with the calling convention of the function's own
    /// signature erased: equal for two functions exactly when they are the
    /// same function except, possibly, for that calling convention (the
    /// parameter and return types, extensions and purposes still count).
    /// Never equal to a fingerprint whose convention is not erased.
    pub fn with_call_conv_erased(&self) -> Fingerprint {
        // The key starts with the signature, whose first word is the
        // calling convention (see `walk::Fingerprinter::signature`): the
        // erased key is the rest, sharing the words, and its hash continues
        // from the hash of that rest's template part.
        let names = &self.words[self.template_len as usize..self.len as usize];
        let (template_hash, hash) = key_hashes(None, self.body_hash, names);
        Self {
            words: self.words.clone(),
            start: 1,
            len: self.len,
            template_len: self.template_len,
            hash,
            template_hash,
            body_hash: self.body_hash,
            instructions: self.instructions,
        }
    }

    /// The canonical key. Equal keys mean interchangeable functions.
    pub fn key(&self) -> &[u32] {
        &self.words[self.start as usize..self.len as usize]
    }

    /// Number of instructions the walk encoded (reachable, in the layout).
    pub fn instructions(&self) -> u32 {
        self.instructions
    }

    /// The in-memory hash: keyed with a per-process random seed, so it is
    /// different in every process. Use [`Fingerprint::stable_hash`] for
    /// anything that is stored or compared across processes.
    pub fn fast_hash(&self) -> u64 {
        self.hash
    }

    /// A 64-bit hash of the key that is the same in every process and on every
    /// machine for a given version of jitfold and Cranelift (XXH3 over the
    /// little-endian bytes of the key, seeded with [`KEY_FORMAT_VERSION`]).
    pub fn stable_hash(&self) -> u64 {
        let mut bytes = Vec::with_capacity(self.key().len() * 4);
        for word in self.key() {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, u64::from(KEY_FORMAT_VERSION))
    }
}

/// The in-memory hashes of a key (see [`key_hashes`]).
#[derive(Clone, Copy, Default)]
struct KeyHashes {
    hash: u64,
    template_hash: u64,
    /// Of the template part after the calling convention.
    body_hash: u64,
}

impl KeyHashes {
    /// The hashes of the exact key `words` whose template part is
    /// `words[..template_len]`.
    fn of(words: &[u32], template_len: u32) -> Self {
        let (template, names) = words.split_at(template_len as usize);
        // The key starts with the calling convention (an empty key, of no
        // function, has none).
        let (call_conv, body) = match template.split_first() {
            Some((call_conv, body)) => (Some(*call_conv), body),
            None => (None, template),
        };
        let body_hash = process_hasher().hash_one(body);
        let (template_hash, hash) = key_hashes(call_conv, body_hash, names);
        Self {
            hash,
            template_hash,
            body_hash,
        }
    }
}

/// A [`Fingerprint`] whose key stays in the [`Fingerprinter`] that computed
/// it ([`Fingerprinter::fingerprint_borrowed`]): the same key and hashes,
/// without the copy. [`DedupCache::get_borrowed`](crate::DedupCache::get_borrowed)
/// takes it, so a cache hit allocates nothing.
#[derive(Clone, Copy)]
pub struct BorrowedFingerprint<'a> {
    words: &'a [u32],
    instructions: u32,
    template_len: u32,
    hashes: KeyHashes,
}

impl BorrowedFingerprint<'_> {
    /// The canonical key, as [`Fingerprint::key`].
    pub fn key(&self) -> &[u32] {
        self.words
    }

    /// The in-memory hash, as [`Fingerprint::fast_hash`].
    pub fn fast_hash(&self) -> u64 {
        self.hashes.hash
    }

    /// Number of instructions the walk encoded.
    pub fn instructions(&self) -> u32 {
        self.instructions
    }

    /// The owned fingerprint: equal to what [`Fingerprinter::fingerprint`]
    /// returns for the same function.
    pub fn to_fingerprint(&self) -> Fingerprint {
        Fingerprint {
            words: self.words.into(),
            start: 0,
            len: self.words.len() as u32,
            template_len: self.template_len,
            hash: self.hashes.hash,
            template_hash: self.hashes.template_hash,
            body_hash: self.hashes.body_hash,
            instructions: self.instructions,
        }
    }
}

/// The in-memory hashes of a key given as its calling convention (`None`
/// when erased), the hash of the rest of its template part, and its names:
/// the template's hash, and the whole key's, which continues from it.
fn key_hashes(call_conv: Option<u32>, body_hash: u64, names: &[u32]) -> (u64, u64) {
    let template_hash = process_hasher().hash_one((call_conv, body_hash));
    (
        template_hash,
        process_hasher().hash_one((template_hash, names)),
    )
}

/// One hasher per process, randomly seeded once, so every fingerprint of this
/// process hashes the same way.
fn process_hasher() -> &'static hashbrown::DefaultHashBuilder {
    static HASHER: OnceLock<hashbrown::DefaultHashBuilder> = OnceLock::new();
    HASHER.get_or_init(hashbrown::DefaultHashBuilder::default)
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.start == other.start && self.key() == other.key()
    }
}

impl Eq for Fingerprint {}

impl Hash for Fingerprint {
    fn hash<H: Hasher>(&self, state: &mut H) {
        write_fast_hash(self.hash, state);
    }
}

/// What `Hash` feeds a hasher for a fingerprint whose
/// [fast hash](Fingerprint::fast_hash) is `fast_hash`; a borrowed key looked
/// up in a table of fingerprints must hash the same way.
pub(crate) fn write_fast_hash<H: Hasher>(fast_hash: u64, state: &mut H) {
    state.write_u64(fast_hash);
}

impl PartialOrd for Fingerprint {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Fingerprint {
    fn cmp(&self, other: &Self) -> Ordering {
        // Erased calling conventions (start 1) after the others, so that
        // `Ord` agrees with `Eq`.
        (self.start, self.key()).cmp(&(other.start, other.key()))
    }
}

impl core::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Fingerprint({:016x}, {} words)",
            self.stable_hash(),
            self.key().len()
        )
    }
}
