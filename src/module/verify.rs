//! Verifying what is not compiled, and fingerprinting that cannot panic.
//!
//! The inner module verifies every function it compiles (when the ISA's
//! flags have `enable_verifier` on, the default). A function that
//! [`DedupModule`] defines without compiling it never reaches that check,
//! and the fingerprint ignores what the verifier would reject in unreachable
//! blocks, so a cache hit alone proves nothing about the function.
//!
//! # What this module guarantees
//!
//! 1. [`DedupModule::verify_uncompiled`] runs Cranelift's verifier on a
//!    function that is about to be defined without being compiled (a cache
//!    hit defined as a trampoline or alias, reused code, an adapter, a
//!    planned duplicate in batch mode) when the ISA's flags enable the
//!    verifier, as the inner module would. A function it rejects gets
//!    `ModuleError::Compilation(CodegenError::Verifier(..))`, the error the
//!    inner module returns for it, and the caller defines nothing. (The
//!    verifier itself does not run for a function exactly like one it
//!    accepted: see 3.)
//! 2. [`walk_checked`] never lets a panic of the walk
//!    escape: a walk that panics on a malformed function (say, a jump to a
//!    block that does not exist) becomes the verifier's error for that
//!    function (the verifier then runs whatever the flags say, since it is
//!    the clearest account of what is wrong), or, should the verifier
//!    accept it, [`DedupError::FingerprintPanic`] with the panic message. The
//!    fingerprinter resets its scratch memory at the start of every walk,
//!    so it stays usable after a caught panic.
//!
//! 3. A function the verifier would read exactly as one it accepted in this
//!    module is not verified again. The verifier reads only the ISA (the
//!    module's, always the same) and the function's stencil but for its
//!    source locations: `Verifier` in cranelift-codegen 0.135.8
//!    (`src/verifier/mod.rs`) touches `self.func` only through `dfg`,
//!    `layout`, `signature`, `global_values`, `sized_stack_slots`,
//!    `dynamic_stack_slots`, `debug_tags` and `is_block_basic`, all of
//!    the stencil, and through `FunctionStencil` itself to build the
//!    control-flow graph and dominator tree; never `name`, `params` or
//!    `srclocs` (its error messages print them). So each accepted function
//!    is kept, one per exact key ([`Verified`], within a bound on their
//!    size), and a later function with
//!    that key whose stencil is equal to it by Cranelift's own `PartialEq`,
//!    field by field but `srclocs`, passes without running the verifier.
//!    The key only finds the candidate: the equality alone decides, so a
//!    function whose key is equal but whose stencil is not (other value
//!    numbers, an unreachable block) is verified. Such skips are counted
//!    in [`Stats::verified_by_equality`](super::Stats).
//!
//! 4. When the ISA's flags enable NaN canonicalization, a function defined
//!    without being compiled also goes through Cranelift's NaN
//!    canonicalization, on a copy: that pass runs on every block in the
//!    layout before unreachable code is removed, and panics on some
//!    functions the verifier accepts (float arithmetic of a type it does
//!    not know, a full memory-flags table), whatever reachable code they
//!    share with a compiled one. Such a function gets the error compiling
//!    it gives ([`DedupError::CraneliftPanic`]). The equality of 3 skips
//!    this too (the pass reads only the stencil).
//!
//! 5. Every function defined without being compiled has its value aliases
//!    checked as Cranelift resolves them before it optimizes
//!    (`DataFlowGraph::resolve_all_aliases`, whatever the flags): every
//!    alias the function holds must lead to a value that is not one, and
//!    every value that an instruction names (in the layout or not: the
//!    pass maps them all) or that debug labels name must exist. The
//!    verifier looks only at the layout, and the key only at reachable
//!    code, so a function built through the API with an alias loop or a
//!    dangling argument elsewhere would otherwise take its twin's code,
//!    where compiling it panics. It gets the error compiling it gives
//!    ([`DedupError::CraneliftPanic`], with Cranelift's own message); see
//!    [`aliases`](super::aliases), which reads every instruction only
//!    where the function's walk did not show that all the values they
//!    name exist ([`crate::Walk::named_values_exist`]). The equality of 3
//!    skips it too.
//!
//! 6. A function defined from a store entry is not run through 1, 4 and
//!    5 when its [read digest](read_digests) is the one the entry holds
//!    ([`Entry::verified`](crate::store::Entry::verified)): the digest of
//!    the function whose compile made the entry, recorded only where that
//!    compile ran the verifier or NaN canonicalization (the flags say so;
//!    the entry's context, which [`Entry::decode`](crate::store::Entry::decode)
//!    checks, holds every flag, so the loading module's flags are the
//!    same), before the compile rewrote it, by a compile known to run
//!    those checks on the function as given (jitfold's own on a flush's
//!    threads, or the inner module's where it is a `JITModule` or an
//!    `ObjectModule`, whose `define_function` is `Context::compile` for
//!    their ISA; another inner module may compile something else, or skip
//!    the verifier, so its entries hold no digest). That compile ran every
//!    check of 1, 4 and 5 on a function the verifier reads alike (by 3:
//!    the digest covers every field [`read_alike`] compares, each as
//!    Cranelift's own `Hash` writes it, see [`read_digests`]) and got no
//!    error, so they would give none now. Two functions with one digest
//!    but read differently would be a collision of BLAKE3 or SHA-256,
//!    whichever the reader checks (the digests' prefix names the compiler,
//!    whose `Hash` encoding they rely on). The entry's digest is as trusted as its code (its
//!    checksum, and its MAC where a secret is set, cover both), so this
//!    trusts nothing new; Cranelift's own incremental cache returns code
//!    on the same grounds (`compute_cache_key`, the stencil's `Hash`
//!    into SHA-256). Such skips count in
//!    [`Stats::verified_by_equality`](super::Stats) too.
//!
//! Functions that are compiled are not verified here: the inner module
//! does that (verifying them twice would cost a third of a compile).

use super::aliases::Named;
use super::define::panic_as_error;
use super::{DedupError, DedupModule};
use crate::fingerprint::Fingerprinter;
use crate::plan::{Walk, WalkRef};
use crate::store::entry::Digests;
use cranelift_codegen::entity::PrimaryMap;
use cranelift_codegen::ir::function::FunctionStencil;
use cranelift_codegen::ir::{self, Function};
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::{CodegenError, Context};
use cranelift_module::{Module, ModuleError, ModuleResult};
use hashbrown::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::LazyLock;

/// How large the copies [`Verified`] keeps may be in all, in entities
/// (see [`size_of`]; a copy takes a few tens of bytes per entity): when a
/// copy would go beyond, the copies kept so far are dropped. A function of
/// more than a quarter of this is never kept.
const KEPT_ENTITIES: usize = 1 << 18;

/// The size of `func` in entities, what a copy of it grows with:
/// instructions, values, blocks, words of value lists (the arguments of
/// branches and calls) and jump-table entries.
fn size_of(func: &Function) -> usize {
    let dfg = &func.dfg;
    let jump_table_entries: usize = dfg
        .jump_tables
        .values()
        .map(|table| table.all_branches().len())
        .sum();
    dfg.num_insts()
        + dfg.num_values()
        + dfg.num_blocks()
        + dfg.value_lists.capacity()
        + jump_table_entries
}

/// The functions this module's verifier accepted (see 3 above): the first
/// one of each exact key, by the key's fast hash, as a copy (without its
/// source locations and names, which the verifier does not read), within
/// [`KEPT_ENTITIES`]. Dropping copies only costs running the verifier
/// again.
#[derive(Default)]
pub(super) struct Verified {
    by_key: HashMap<u64, Function>,
    /// The sizes of the copies in `by_key` (see [`size_of`]), summed.
    entities: usize,
}

impl Verified {
    /// Whether the verifier accepted a function with key hash `key` that
    /// it reads exactly as `func`.
    fn holds(&self, key: u64, func: &Function) -> bool {
        self.by_key
            .get(&key)
            .is_some_and(|accepted| read_alike(accepted, func))
    }

    /// Keeps a copy of `func`, just accepted, for key hash `key` unless a
    /// function is kept for it or it is too large (see [`KEPT_ENTITIES`]).
    fn keep(&mut self, key: u64, func: &Function) {
        let size = size_of(func);
        if size > KEPT_ENTITIES / 4 || self.by_key.contains_key(&key) {
            return;
        }
        if self.entities + size > KEPT_ENTITIES {
            self.by_key.clear();
            self.entities = 0;
        }
        let mut copy = Function::new();
        copy.stencil = func.stencil.clone();
        copy.stencil.srclocs.clear();
        self.by_key.insert(key, copy);
        self.entities += size;
    }
}

/// What the verifier reads of a function (see 3 above): its stencil but
/// for source locations (fields it does not read but `srclocs`, such as
/// `stack_limit`, count all the same), borrowed, the cheaper comparisons
/// first. [`ReadFields::of`] destructures the stencil, so that a new field
/// of `FunctionStencil` is a compile error there.
#[derive(PartialEq, Hash)]
struct ReadFields<'a> {
    signature: &'a ir::Signature,
    sized_stack_slots: &'a ir::StackSlots,
    dynamic_stack_slots: &'a ir::DynamicStackSlots,
    global_values: &'a PrimaryMap<ir::GlobalValue, ir::GlobalValueData>,
    layout: &'a ir::Layout,
    debug_tags: &'a ir::DebugTags,
    stack_limit: &'a Option<ir::GlobalValue>,
    dfg: &'a ir::DataFlowGraph,
}

impl<'a> ReadFields<'a> {
    fn of(func: &'a Function) -> Self {
        let FunctionStencil {
            version_marker: _,
            signature,
            sized_stack_slots,
            dynamic_stack_slots,
            global_values,
            dfg,
            layout,
            srclocs: _,
            debug_tags,
            stack_limit,
        } = &func.stencil;
        Self {
            signature,
            sized_stack_slots,
            dynamic_stack_slots,
            global_values,
            layout,
            debug_tags,
            stack_limit,
            dfg,
        }
    }
}

/// The key derivation context of [`read_digests`]: what `Hash` writes is
/// Rust's to choose, and only one compiler version is sure to write one
/// stencil alike (`build.rs` records it), so digests of builds by other
/// compilers never match; nor do digests of another encoding (the `2`:
/// lengths and discriminants as LEB128, see [`read_digests`]).
const READ_DIGEST_CONTEXT: &str = concat!("jitfold read digest 2, ", env!("JITFOLD_RUSTC_VERSION"));

/// The digests of `func` as the verifier reads it (see 6 above), as the
/// writer of an entry records them: BLAKE3 (derived key
/// [`READ_DIGEST_CONTEXT`]) and SHA-256 (after a 64-byte block: the
/// SHA-256 of that context, then zeros) over what its [`ReadFields`]
/// write through `Hash`. Cranelift's own `Hash`, derived but for a few
/// types, which hash what their `PartialEq` compares but for caches
/// derived from it (`AliasRegionSet`'s map from regions back to their
/// numbers, which no check reads). Lengths and enum discriminants (`usize`
/// and `isize`, most of them small) are written as LEB128 (`isize`
/// zigzagged) instead of 8 bytes each: a code in which no word is the
/// start of another, so the stream still determines every value written,
/// in order, and there is a sixth less to hash (a warm start of SQLite's
/// functions: 23 MB instead of 28). A reader checks one of the two
/// ([`read_digest_matches`]); SHA-256's is left out (zeros) where no
/// reader checks it ([`Digests::of`]).
pub(super) fn read_digests(func: &Function) -> Digests {
    let written = read_fields_written(func);
    Digests::of(
        written.len(),
        || read_blake3(&written),
        || read_sha256(&written),
    )
}

/// Whether `func`'s read fields are those whose digests an entry holds as
/// `digests`: by whichever digest this machine computes faster for their
/// length ([`Digests::matches`]; either alone is collision-resistant).
pub(super) fn read_digest_matches(func: &Function, digests: &Digests) -> bool {
    let written = read_fields_written(func);
    digests.matches(
        written.len(),
        || read_blake3(&written),
        || read_sha256(&written),
    )
}

/// What `func`'s [`ReadFields`] write through `Hash` (see [`read_digests`]).
fn read_fields_written(func: &Function) -> Vec<u8> {
    use std::hash::Hash;
    let mut written = Written(Vec::with_capacity(64 * size_of(func)));
    ReadFields::of(func).hash(&mut written);
    written.0
}

/// The BLAKE3 half of [`read_digests`].
fn read_blake3(written: &[u8]) -> [u8; 32] {
    // The hasher as made for the context, cloned: deriving the key from
    // the context anew is a compression per function.
    static FOR_READS: LazyLock<blake3::Hasher> =
        LazyLock::new(|| blake3::Hasher::new_derive_key(READ_DIGEST_CONTEXT));
    *FOR_READS.clone().update(written).finalize().as_bytes()
}

/// The SHA-256 half of [`read_digests`].
fn read_sha256(written: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    // The state after the context's block, computed once and cloned.
    static FOR_READS: LazyLock<sha2::Sha256> = LazyLock::new(|| {
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(&sha2::Sha256::digest(READ_DIGEST_CONTEXT));
        sha2::Sha256::new_with_prefix(block)
    });
    FOR_READS.clone().chain_update(written).finalize().into()
}

/// Collects what `Hash` writes (Cranelift's types hash through the generic
/// `Hasher`), for [`read_digests`]: bytes as given, `usize` and `isize` as
/// LEB128 (`isize` zigzagged).
struct Written(Vec<u8>);

impl Written {
    /// Seven bits a byte, low first, the top bit set on all but the last.
    fn leb128(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.0.push(n as u8 | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }
}

impl std::hash::Hasher for Written {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn write_usize(&mut self, n: usize) {
        self.leb128(n as u64);
    }
    fn write_isize(&mut self, n: isize) {
        let n = n as i64;
        self.leb128(((n << 1) ^ (n >> 63)) as u64);
    }
    fn finish(&self) -> u64 {
        unreachable!("only written to")
    }
}

/// Whether the verifier reads `a` and `b` alike: their [`ReadFields`] are
/// equal (see 3 above).
fn read_alike(a: &Function, b: &Function) -> bool {
    ReadFields::of(a) == ReadFields::of(b)
}

impl<M: Module> DedupModule<M> {
    /// [`checks_uncompiled`] for the inner module's ISA.
    pub(super) fn checks_uncompiled(&self) -> bool {
        checks_uncompiled(self.inner.isa())
    }

    /// Marks `func`, about to be defined from a store entry that holds
    /// `digest`, as verified if its read digest is that one (see 6 above).
    pub(super) fn verified_by_entry(
        &mut self,
        func: &Function,
        digest: Option<&Digests>,
        verified: &mut Unverified,
    ) {
        let Some(digest) = digest else {
            return;
        };
        if verified.done || !self.checks_uncompiled() {
            return;
        }
        if read_digest_matches(func, digest) {
            verified.done = true;
            self.stats.verified_by_equality += 1;
        }
    }

    /// Verifies `func`, which is about to be defined without being
    /// compiled, if the ISA's flags enable the verifier (see 1 above).
    /// `walked` is what a walk of it as it is now found, if walked: then a
    /// function the verifier accepted with the same exact key and reads
    /// alike passes without the verifier, and one it accepts now is kept
    /// (see 3 above).
    pub(super) fn verify_uncompiled(
        &mut self,
        func: &Function,
        walked: Option<Walked>,
    ) -> ModuleResult<()> {
        let isa = self.inner.isa();
        let named = walked.map_or(Named::UNKNOWN, |walked| walked.named);
        if !self.checks_uncompiled() {
            // Cheaper than keeping a copy to skip it next time.
            return super::aliases::check(func, isa, named);
        }
        if let Some(walked) = walked
            && self.verified.holds(walked.key, func)
        {
            self.stats.verified_by_equality += 1;
            return Ok(());
        }
        run_checks(func, isa, named)?;
        if let Some(walked) = walked {
            self.verified.keep(walked.key, func);
        }
        Ok(())
    }

    /// [`DedupModule::verified_by_entry`], then
    /// [`DedupModule::verify_once`], for `func`, about to be defined from
    /// a store entry that holds `digest`, or, where a flush's thread ran
    /// them already on this function ([`checks_for_entry`]), their outcome
    /// `found`.
    pub(super) fn verify_for_entry(
        &mut self,
        func: &Function,
        digest: Option<&Digests>,
        found: Option<ModuleResult<Checked>>,
        verified: &mut Unverified,
    ) -> ModuleResult<()> {
        let Some(found) = found.filter(|_| !verified.done) else {
            self.verified_by_entry(func, digest, verified);
            return self.verify_once(func, verified);
        };
        // As the two would decide, in their order: the entry's digest, a
        // function read alike to one accepted (which the checks pass
        // alike, see 3 above), then the checks' outcome.
        let checks = self.checks_uncompiled();
        match found {
            Ok(Checked::ByEntry) => self.stats.verified_by_equality += 1,
            _ if checks && self.verified.holds(verified.walked.key, func) => {
                self.stats.verified_by_equality += 1;
            }
            found => {
                found?;
                if checks {
                    self.verified.keep(verified.walked.key, func);
                }
            }
        }
        verified.done = true;
        Ok(())
    }

    /// [`DedupModule::verify_uncompiled`] unless `verified` says it was
    /// done; marks it done.
    pub(super) fn verify_once(
        &mut self,
        func: &Function,
        verified: &mut Unverified,
    ) -> ModuleResult<()> {
        if !verified.done {
            self.verify_uncompiled(func, Some(verified.walked))?;
            verified.done = true;
        }
        Ok(())
    }
}

/// Whether a function defined for `isa` without being compiled goes
/// through Cranelift's verifier or NaN canonicalization (its flags enable
/// either): then what a compile checked is worth recording (see 6 above).
/// Where neither is enabled, such a function goes through the alias check
/// alone (see 5 above).
pub(super) fn checks_uncompiled(isa: &dyn TargetIsa) -> bool {
    let flags = isa.flags();
    flags.enable_verifier() || flags.enable_nan_canonicalization()
}

/// What [`DedupModule::verify_uncompiled`] runs on `func` for `isa`
/// when the flags enable the verifier or NaN canonicalization, whatever
/// was verified before (see 1, 4 and 5 above), with its outcome.
fn run_checks(func: &Function, isa: &dyn TargetIsa, named: Named) -> ModuleResult<()> {
    let flags = isa.flags();
    if flags.enable_verifier() {
        verify(func, isa)?;
    }
    if flags.enable_nan_canonicalization() {
        canonicalize_nans(func, isa)?;
    }
    super::aliases::check(func, isa, named)
}

/// How a function to be defined from a store entry passed the checks of
/// 1, 4 and 5 above.
pub(super) enum Checked {
    /// Its read digest is the entry's (see 6 above): none ran.
    ByEntry,
    /// They ran.
    Ran,
}

/// The checks `func`, about to be defined from a store entry that holds
/// `digest`, goes through for `isa`, run here, whatever this module
/// verified before: none where its read digest is `digest` (see 6 above),
/// otherwise those of [`DedupModule::verify_uncompiled`] (the alias check
/// alone where the flags enable neither the verifier nor NaN
/// canonicalization). A function of `func` and `isa` alone, so a flush's
/// thread may run it ahead of the function's turn (see `stored.rs`); the
/// outcome is the one the turn would have.
pub(super) fn checks_for_entry(
    func: &Function,
    isa: &dyn TargetIsa,
    digest: Option<&Digests>,
    named: Named,
) -> ModuleResult<Checked> {
    if !checks_uncompiled(isa) {
        return super::aliases::check(func, isa, named).map(|()| Checked::Ran);
    }
    if digest.is_some_and(|digest| read_digest_matches(func, digest)) {
        return Ok(Checked::ByEntry);
    }
    run_checks(func, isa, named).map(|()| Checked::Ran)
}

/// What a walk of a function, as it is now, tells its checks: the fast
/// hash of its exact key (see 3 above) and what it showed of the values
/// its instructions name (see 5 above).
#[derive(Clone, Copy)]
pub(super) struct Walked {
    key: u64,
    named: Named,
}

impl Walked {
    /// What `walk` tells.
    pub(super) fn of(walk: &WalkRef<'_>) -> Self {
        Self {
            key: walk.fingerprint.fast_hash(),
            named: Named::of(walk),
        }
    }
}

/// Whether a function being defined was verified yet, with what its walk
/// tells its checks.
pub(super) struct Unverified {
    walked: Walked,
    done: bool,
}

impl Unverified {
    /// The function `walk` walked (as it is now), not verified yet.
    pub(super) fn new(walk: &WalkRef<'_>) -> Self {
        Self {
            walked: Walked::of(walk),
            done: false,
        }
    }
}

/// The walk of `func` by `walker`, or an error if the walk panics on it
/// (see 2 above); `isa` is the module's.
pub(super) fn walk_checked<'w>(
    walker: &'w mut Fingerprinter,
    func: &Function,
    isa: &dyn TargetIsa,
) -> ModuleResult<WalkRef<'w>> {
    // The walk's only state is scratch memory that every walk resets, so
    // it is sound to use it again after a caught panic.
    let outcome = catch_unwind(AssertUnwindSafe(move || {
        let walker = walker;
        WalkRef::of(walker, func)
    }));
    outcome.or_else(|panic| {
        let message = crate::compile::panic_message(&panic);
        verify(func, isa)?;
        Err(DedupError::FingerprintPanic { message }.into())
    })
}

/// Walks `func` ahead of its turn (when it is recorded for a flush, or on
/// a flush's threads) for a module whose ISA is `isa`: `None` if the walk
/// panics, which leaves the error to [`walk_checked`] at its turn. (The
/// walk's only state is scratch memory that every walk resets, so the
/// walker stays usable.)
///
/// Where `isa`'s flags enable neither the verifier nor NaN
/// canonicalization ([`checks_uncompiled`]), it also reads whether the
/// function's alias chains are one link long ([`Walk::alias_chains_short`])
/// while the function is in the CPU's caches: there every function defined
/// without compiling goes through the alias check, which the fact
/// shortens. Where either is enabled, a function loaded from an entry with
/// its own read digest goes through no check (see 6 above), and any other
/// through the verifier, which reads the whole function anyway; reading
/// every value of every function ahead cost a batch warm start of SQLite's
/// functions with the verifier on a twenty-fifth of its time.
pub(super) fn walk_ahead(
    walker: &mut Fingerprinter,
    func: &Function,
    isa: &dyn TargetIsa,
) -> Option<Walk> {
    let read_aliases = !checks_uncompiled(isa);
    catch_unwind(AssertUnwindSafe(|| {
        let mut walk = Walk::of(walker, func);
        walk.alias_chains_short = read_aliases && super::aliases::alias_chains_short(&func.dfg);
        walk
    }))
    .ok()
}

/// Runs Cranelift's NaN canonicalization on a copy of `func` (the flags
/// enable it), with the error compiling `func` would give. The pass
/// rewrites every block in the layout, reachable or not, before
/// unreachable code is removed (`Context::optimize`), and panics on float
/// arithmetic of a type it does not know, or when the memory-flags table
/// it adds to is full (`nan_canonicalization.rs`): the key leaves
/// unreachable blocks and unused memory flags out, so a function defined
/// without compiling it runs the pass here (see 4 above).
fn canonicalize_nans(func: &Function, isa: &dyn TargetIsa) -> ModuleResult<()> {
    let mut ctx = Context::for_function(func.clone());
    panic_as_error(func, || {
        ctx.canonicalize_nans(isa).map_err(ModuleError::Compilation)
    })
}

/// Runs Cranelift's verifier on `func` for `isa`, with the inner module's
/// error for a rejected function (and, should the verifier panic on it, as
/// it can building the control-flow graph of a malformed function, the
/// error compiling it gives).
fn verify(func: &Function, isa: &dyn TargetIsa) -> ModuleResult<()> {
    panic_as_error(func, || {
        cranelift_codegen::verify_function(func, isa)
            .map_err(|errors| ModuleError::Compilation(CodegenError::Verifier(errors)))
    })
}

#[cfg(test)]
mod tests {
    use super::{KEPT_ENTITIES, Verified, Written, size_of};

    /// The digest's lengths and discriminants: each value's bytes decode
    /// back to it, and no value's bytes start another's (so a stream of
    /// them, and of fixed-width values, determines what was written).
    #[test]
    fn lengths_and_discriminants_are_written_so_that_they_read_back() {
        use std::hash::Hasher;
        let decode = |bytes: &[u8]| {
            let mut n = 0u64;
            for (i, b) in bytes.iter().enumerate() {
                n |= u64::from(b & 0x7f) << (7 * i);
                if b & 0x80 == 0 {
                    return (i + 1 == bytes.len()).then_some(n);
                }
            }
            None
        };
        let unsigned = [0, 1, 127, 128, 255, 300, 16383, 16384, 1 << 40, usize::MAX];
        let mut written: Vec<Vec<u8>> = Vec::new();
        for n in unsigned {
            let mut w = Written(Vec::new());
            w.write_usize(n);
            assert_eq!(decode(&w.0), Some(n as u64), "{n}");
            written.push(w.0);
        }
        let signed = [0, -1, 1, -64, 64, isize::MIN, isize::MAX];
        let mut zigzags = Vec::new();
        for n in signed {
            let mut w = Written(Vec::new());
            w.write_isize(n);
            zigzags.push(decode(&w.0).expect("decodes"));
        }
        zigzags.sort_unstable();
        zigzags.dedup();
        assert_eq!(zigzags.len(), signed.len(), "distinct signed values");
        for (i, a) in written.iter().enumerate() {
            for (j, b) in written.iter().enumerate() {
                assert!(i == j || !b.starts_with(a), "{a:?} starts {b:?}");
            }
        }
    }
    use cranelift_codegen::cursor::{Cursor, FuncCursor};
    use cranelift_codegen::ir::{Function, InstBuilder, types::I64};

    /// A function of `n` instructions: `n - 1` constants `k`, a return.
    fn of(n: usize, k: i64) -> Function {
        let mut func = Function::new();
        let block = func.dfg.make_block();
        func.layout.append_block(block);
        let mut pos = FuncCursor::new(&mut func).at_bottom(block);
        for _ in 1..n {
            pos.ins().iconst(I64, k);
        }
        pos.ins().return_(&[]);
        func
    }

    #[test]
    fn a_kept_function_is_found_under_its_key_only_by_one_alike() {
        let mut verified = Verified::default();
        verified.keep(1, &of(10, 0));
        assert!(verified.holds(1, &of(10, 0)));
        assert!(!verified.holds(1, &of(10, 1)));
        assert!(!verified.holds(2, &of(10, 0)));
        // The first function of a key stays.
        verified.keep(1, &of(10, 1));
        assert!(verified.holds(1, &of(10, 0)));
        assert!(!verified.holds(1, &of(10, 1)));
    }

    #[test]
    fn the_copies_stay_within_their_bound() {
        let mut verified = Verified::default();
        let huge = of(KEPT_ENTITIES / 4, 0);
        assert!(size_of(&huge) > KEPT_ENTITIES / 4);
        verified.keep(0, &huge);
        assert!(!verified.holds(0, &huge));
        let size = size_of(&of(1000, 0));
        let fit = KEPT_ENTITIES / size;
        for key in 1..=fit as u64 {
            verified.keep(key, &of(1000, key as i64));
        }
        assert!((1..=fit as u64).all(|key| verified.holds(key, &of(1000, key as i64))));
        assert_eq!(verified.entities, fit * size);
        // One more goes beyond: the others are dropped.
        let last = fit as u64 + 1;
        verified.keep(last, &of(1000, last as i64));
        assert!(verified.holds(last, &of(1000, last as i64)));
        assert!(!verified.holds(1, &of(1000, 1)));
        assert_eq!(verified.entities, size);
    }

    #[test]
    fn a_copy_leaves_out_source_locations_and_is_still_alike() {
        let mut verified = Verified::default();
        let mut located = of(10, 0);
        let first = located
            .layout
            .first_inst(located.layout.entry_block().unwrap())
            .unwrap();
        located.srclocs[first] = cranelift_codegen::ir::RelSourceLoc::new(3);
        verified.keep(1, &located);
        assert!(verified.by_key[&1].srclocs.is_empty());
        assert!(verified.holds(1, &of(10, 0)));
        assert!(verified.holds(1, &located));
    }

    /// The read digest is equal exactly where the functions read alike,
    /// on these pairs: source locations aside, any change shows.
    #[test]
    fn the_read_digest_differs_where_the_verifier_reads_a_difference() {
        use super::{read_alike, read_digest_matches, read_digests};
        let read_digest = read_digests;
        use cranelift_codegen::ir::{RelSourceLoc, StackSlotData, StackSlotKind};
        let base = of(10, 0);
        let mut located = of(10, 0);
        let first = located
            .layout
            .first_inst(located.layout.entry_block().unwrap());
        located.srclocs[first.unwrap()] = RelSourceLoc::new(3);
        let mut unreachable = of(10, 0);
        let dead = unreachable.dfg.make_block();
        unreachable.layout.append_block(dead);
        FuncCursor::new(&mut unreachable)
            .at_bottom(dead)
            .ins()
            .return_(&[]);
        let mut slot = of(10, 0);
        slot.sized_stack_slots
            .push(StackSlotData::new(StackSlotKind::ExplicitSlot, 8, 0));
        let mut limited = of(10, 0);
        let vmctx = limited
            .global_values
            .push(cranelift_codegen::ir::GlobalValueData::VMContext);
        limited.stack_limit = Some(vmctx);
        let mut unplaced = of(10, 0);
        // An instruction made but not placed in the layout.
        unplaced
            .dfg
            .make_inst(cranelift_codegen::ir::InstructionData::UnaryImm {
                opcode: cranelift_codegen::ir::Opcode::Iconst,
                imm: 5.into(),
            });
        let digest = read_digest(&base);
        assert_eq!(read_digest(&base.clone()), digest);
        assert!(read_alike(&base, &located));
        assert_eq!(read_digest(&located), digest);
        assert!(read_digest_matches(&located, &digest));
        for other in [of(10, 1), of(11, 0), unreachable, slot, limited, unplaced] {
            assert!(!read_alike(&base, &other));
            let theirs = read_digest(&other);
            assert_ne!(theirs.blake3, digest.blake3, "{}", other.display());
            assert_ne!(theirs.sha256, digest.sha256, "{}", other.display());
            assert!(!read_digest_matches(&other, &digest));
        }
    }

    /// The digests are BLAKE3 with the key derived from their context,
    /// and SHA-256 after a block of the context's SHA-256, over what the
    /// function's read fields write: the hashers kept and cloned for each
    /// digest give what ones made anew do, every time (the digests are
    /// stored in entries, so they must not drift). A function matches its
    /// own digests, small (read by SHA-256 where this CPU has its
    /// instructions) or large (by BLAKE3), and not digests with the one
    /// this machine reads changed.
    #[test]
    fn the_read_digests_are_blake3_and_sha256_of_their_context_and_the_fields_read() {
        use super::{READ_DIGEST_CONTEXT, ReadFields, read_digest_matches, read_digests};
        use crate::store::entry::{SHA256_BELOW, checks_by_sha256};
        use sha2::Digest;
        use std::hash::Hash;
        let mut both_ways = [false; 2];
        for n in [1, 10, 500, 2000] {
            let func = of(n, 7);
            let mut written = Written(Vec::new());
            ReadFields::of(&func).hash(&mut written);
            let blake3 = *blake3::Hasher::new_derive_key(READ_DIGEST_CONTEXT)
                .update(&written.0)
                .finalize()
                .as_bytes();
            let mut prefix = sha2::Sha256::digest(READ_DIGEST_CONTEXT).to_vec();
            prefix.resize(64, 0);
            prefix.extend_from_slice(&written.0);
            let sha256: [u8; 32] = if written.0.len() < SHA256_BELOW {
                sha2::Sha256::digest(&prefix).into()
            } else {
                [0; 32]
            };
            let digests = read_digests(&func);
            assert_eq!((digests.blake3, digests.sha256), (blake3, sha256), "{n}");
            assert_eq!(read_digests(&func), digests, "{n} instructions, again");
            assert!(read_digest_matches(&func, &digests));
            let by_sha256 = checks_by_sha256(written.0.len());
            both_ways[usize::from(by_sha256)] = true;
            let mut changed = digests;
            if by_sha256 {
                changed.sha256[0] ^= 1;
            } else {
                changed.blake3[0] ^= 1;
            }
            assert!(!read_digest_matches(&func, &changed), "{n}");
        }
        // The largest function is read by BLAKE3 on every machine; the
        // smallest by SHA-256 where the CPU has its instructions.
        assert!(both_ways[0]);
        assert_eq!(
            both_ways[1],
            checks_by_sha256(0),
            "a small function is read by SHA-256 exactly where this machine can"
        );
    }
}
