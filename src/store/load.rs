//! The one path from a store to usable code: [`load`] looks an entry up
//! (or takes the bytes a batch already fetched), and [`check`] decodes it
//! and runs every check, handing back the code or why it is a miss.
//! [`crate::DedupModule`], `jitfold report --cache` and the store benchmark
//! all load through here; nothing else decodes entries.
//!
//! # What this module guarantees
//!
//! 1. [`check`] accepts an entry only if [`Entry::decode`] does (checksum,
//!    MAC when a secret is set, context, template), its relocations
//!    retarget to the function's names, its alignment is one a compile for
//!    the ISA gives ([`code_alignments`]), every relocation is of a kind
//!    Cranelift's backend for the ISA and its flags emits ([`emitted_on`]),
//!    and, where the caller needs unwind information for code defined from
//!    bytes, the entry has it (or the ISA gives none). Anything else is a
//!    [`Rejection`], naming the check.
//! 2. [`load`] never fails: a store that cannot answer is
//!    [`Miss::Store`]; a key the store does not hold is [`Miss::Reserved`],
//!    with the [`Reservation`] the caller ends (a store may reserve on
//!    `get_or_reserve` whatever [`CodeStore::reserves`] says), or, where a
//!    batch fetched it already and the store reserves nothing,
//!    [`Miss::Absent`].
//! 3. A [`Reservation`] ends exactly once: with [`Reservation::put`] or a
//!    [`write()`] that succeeds, or, when it is dropped unused (a compile
//!    that failed, panicked, or made no entry) or its write fails, with
//!    [`CodeStore::release`], so that waiting modules may compile the key.
//!
//! Verifying the function itself is not an entry's check: a
//! `DedupModule` verifies every function it defines without compiling in
//! one place (`verify.rs` in `src/module/`), after a hit here.

use super::entry::Digests;
use super::{
    Claim, CodeContext, CodeStore, Entry, EntryRejected, EntryUnwind, Secret, StoreError, StoreKey,
};
use crate::code::MachineCode;
use crate::fingerprint::SymbolName;
use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_codegen::settings::TlsModel;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use target_lexicon::Architecture;

/// What an entry is checked against besides its bytes (see 1 above).
#[derive(Clone, Copy)]
pub struct Checks<'a> {
    /// The context entries must have been made in.
    pub context: &'a CodeContext,
    /// The secret entries must be signed with, if any.
    pub secret: Option<&'a Secret>,
    /// The ISA the code is for (with its flags).
    pub isa: &'a dyn TargetIsa,
    /// Whether code without unwind information (an entry made without the
    /// `store-unwind` feature) is refused: the caller writes frame
    /// descriptions for code defined from bytes.
    pub needs_unwind: bool,
}

/// Code that passed every check.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The code, relocations against the function's own names.
    pub code: MachineCode,
    /// Its unwind information, where the entry has it.
    pub unwind: Option<UnwindInfo>,
    /// What compiling it cost when it was compiled: what the hit saves.
    pub compile_time: Duration,
    /// The digests of the function it was compiled from, where the entry
    /// holds them ([`Entry::verified`]).
    pub verified: Option<Digests>,
}

/// Why an entry found is not used (see 1 above).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// [`Entry::decode`] refused it.
    Entry(EntryRejected),
    /// Its relocations name more or fewer slots than the function has.
    Names,
    /// Made without unwind information, where the caller needs it.
    UnwindOmitted,
    /// An alignment no compile for this ISA gives.
    Alignment(u32),
    /// A relocation kind the backend for this ISA and flags never emits.
    RelocationKind(Reloc),
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Entry(e) => write!(f, "{e}"),
            Rejection::Names => write!(f, "its names are not the function's"),
            Rejection::UnwindOmitted => write!(
                f,
                "it has no unwind information (made without the `store-unwind` feature), \
                 which this module needs"
            ),
            Rejection::Alignment(a) => write!(f, "alignment {a} is not one this ISA gives"),
            Rejection::RelocationKind(kind) => {
                write!(f, "relocation kind {kind:?} is not one this ISA emits")
            }
        }
    }
}

/// Why [`load`] gives no code (see 2 above).
pub enum Miss {
    /// The store did not hold the key when a batch fetched it, and does
    /// not reserve keys.
    Absent,
    /// The store does not hold the key, and may have reserved it for the
    /// caller, who compiles it and ends the reservation (a no-op where the
    /// store reserves nothing).
    Reserved(Reservation),
    /// The store could not answer.
    Store(StoreError),
    /// The entry found is not used.
    Rejected(Rejection),
}

impl fmt::Debug for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Miss::Absent => write!(f, "Absent"),
            Miss::Reserved(r) => write!(f, "Reserved({})", r.key()),
            Miss::Store(e) => write!(f, "Store({e})"),
            Miss::Rejected(r) => write!(f, "Rejected({r:?})"),
        }
    }
}

/// A key a store reserved for its caller (see 3 above).
pub struct Reservation {
    store: Option<Arc<dyn CodeStore>>,
    key: StoreKey,
}

impl Reservation {
    /// The key reserved.
    pub fn key(&self) -> StoreKey {
        self.key
    }

    /// Ends the reservation by storing `value` under its key; should that
    /// fail, by releasing it.
    pub fn put(mut self, value: &[u8]) -> Result<(), StoreError> {
        let store = self.store.take().expect("a reservation ends once");
        let put = store.put(&self.key, value);
        if put.is_err() {
            store.release(&self.key);
        }
        put
    }
}

/// An entry to write, with the reservation its write ends, if any.
pub struct Unwritten {
    /// Its key.
    pub key: StoreKey,
    /// The encoded entry.
    pub value: Vec<u8>,
    /// The reservation of `key` held for it, if any.
    pub reservation: Option<Reservation>,
}

/// Writes `entries` to `store` with one [`CodeStore::put_many`]; the
/// reservations they hold end with it, released should it fail (see 3
/// above). The number of entries written, or the store's error.
pub fn write(store: &Arc<dyn CodeStore>, entries: Vec<Unwritten>) -> Result<usize, StoreError> {
    let mut pairs = Vec::with_capacity(entries.len());
    let mut reservations = Vec::new();
    for Unwritten {
        key,
        value,
        reservation,
    } in entries
    {
        pairs.push((key, value));
        reservations.extend(reservation);
    }
    let written = store.put_many(&pairs);
    if written.is_ok() {
        // Ended by the writes: nothing to release.
        reservations.into_iter().for_each(Reservation::written);
    }
    // Otherwise dropped here: released.
    written.map(|()| pairs.len())
}

impl Reservation {
    /// Ends the reservation, its key written by a [`write()`].
    fn written(mut self) {
        self.store = None;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            store.release(&self.key);
        }
    }
}

/// What [`claim`] found.
pub enum Claimed {
    /// The key's value (not checked yet: [`load`] it as
    /// [`Source::Fetched`]).
    Found(Vec<u8>),
    /// The key is the caller's to compile.
    Reserved(Reservation),
    /// Another caller is compiling it.
    Busy,
}

/// Claims `key` in `store` without waiting for another caller
/// ([`CodeStore::try_get_or_reserve`]): its value, its reservation, or
/// word that another caller is compiling it.
pub fn claim(store: &Arc<dyn CodeStore>, key: StoreKey) -> Result<Claimed, StoreError> {
    Ok(match store.try_get_or_reserve(&key)? {
        Claim::Found(value) => Claimed::Found(value),
        Claim::Reserved => Claimed::Reserved(Reservation {
            store: Some(store.clone()),
            key,
        }),
        Claim::Busy => Claimed::Busy,
    })
}

/// [`claim`] of each of `keys`, in order, with one
/// [`CodeStore::try_get_or_reserve_many`].
pub fn claim_many(
    store: &Arc<dyn CodeStore>,
    keys: &[StoreKey],
) -> Result<Vec<Claimed>, StoreError> {
    let claims = store.try_get_or_reserve_many(keys)?;
    Ok(keys
        .iter()
        .zip(claims)
        .map(|(&key, claim)| match claim {
            Claim::Found(value) => Claimed::Found(value),
            Claim::Reserved => Claimed::Reserved(Reservation {
                store: Some(store.clone()),
                key,
            }),
            Claim::Busy => Claimed::Busy,
        })
        .collect())
}

/// Where [`load`] gets an entry's bytes from.
pub enum Source {
    /// Asks the store (`get_or_reserve` where it reserves keys).
    Ask,
    /// What a batch already fetched for the key: its value, or `None`
    /// when the store did not hold it (asked again only where the store
    /// reserves keys, to reserve it).
    Fetched(Option<Vec<u8>>),
}

/// The code stored under `key` (the [`StoreKey::of_words`] of `template`
/// in `checks.context`) in `store` for a function whose template has the
/// key words `template` ([`Template::key`](crate::Template::key)) and
/// whose names are `names`, checked (see [`check`]), or why there is none.
/// The words are borrowed from the function's walk: a lookup copies none
/// of them.
pub fn load(
    store: &Arc<dyn CodeStore>,
    key: StoreKey,
    source: Source,
    checks: &Checks<'_>,
    template: &[u32],
    names: &[SymbolName],
) -> Result<Loaded, Miss> {
    debug_assert!(key == StoreKey::of_words(checks.context, template));
    let fetched = match source {
        Source::Fetched(Some(bytes)) => {
            return check(&bytes, checks, template, names).map_err(Miss::Rejected);
        }
        Source::Fetched(None) if !store.reserves() => return Err(Miss::Absent),
        Source::Fetched(None) | Source::Ask => store.get_or_reserve(&key),
    };
    match fetched {
        Ok(Some(bytes)) => check(&bytes, checks, template, names).map_err(Miss::Rejected),
        // `get_or_reserve` found nothing, and may have reserved the key
        // whatever `reserves` says of the store (releasing is a no-op for
        // a store that did not).
        Ok(None) => Err(Miss::Reserved(Reservation {
            store: Some(store.clone()),
            key,
        })),
        Err(e) => Err(Miss::Store(e)),
    }
}

/// The code of the entry in `bytes` for the template whose key words are
/// `template` ([`Template::key`](crate::Template::key)), retargeted to
/// `names`, if it passes every check of 1 above.
pub fn check(
    bytes: &[u8],
    checks: &Checks<'_>,
    template: &[u32],
    names: &[SymbolName],
) -> Result<Loaded, Rejection> {
    let entry = Entry::decode_words(bytes, checks.context, template, checks.secret)
        .map_err(Rejection::Entry)?;
    let unwind = match entry.unwind() {
        EntryUnwind::None => None,
        EntryUnwind::Info(info) => Some(info.clone()),
        EntryUnwind::Omitted if checks.needs_unwind => return Err(Rejection::UnwindOmitted),
        EntryUnwind::Omitted => None,
    };
    let code = entry.code(names).ok_or(Rejection::Names)?;
    // Aligned as a compile for this ISA aligns, or not used: the JIT's
    // memory providers assume as much (the system one overruns its region
    // for an alignment beyond a page).
    if !code_alignments(checks.isa).is_some_and(|a| a.contains(&code.alignment)) {
        return Err(Rejection::Alignment(code.alignment));
    }
    // Relocations of kinds a compile for this ISA and its flags emits, or
    // not used: a module may panic on another kind (see `emitted_on`).
    if let Some(r) = code.relocs.iter().find(|r| !emitted_on(checks.isa, r.kind)) {
        return Err(Rejection::RelocationKind(r.kind));
    }
    Ok(Loaded {
        code,
        unwind,
        compile_time: entry.compile_time(),
        verified: entry.verified().copied(),
    })
}

/// The alignments Cranelift gives a function's code when it compiles for
/// `isa`: from the ISA's minimum, raised to `1 << log2_min_function_alignment`
/// (`MachBuffer::set_log2_min_function_alignment`), up to that or 16 if
/// larger, the most a constant in the code asks (`VCodeConstantData::alignment`
/// in cranelift-codegen 0.135.8, `machinst/vcode.rs`: 8 or 16). `None`
/// when the flag asks for more than 2^31 (Cranelift's compile panics then).
pub fn code_alignments(isa: &dyn TargetIsa) -> Option<std::ops::RangeInclusive<u32>> {
    let flag = 1u32.checked_shl(u32::from(isa.flags().log2_min_function_alignment()))?;
    let least = isa.function_alignment().minimum.max(flag);
    Some(least..=least.max(16))
}

/// Whether Cranelift's backend for `isa` may emit a relocation of `kind`
/// with `isa`'s flags: the kinds of its architecture (`isa/*/inst/emit.rs`
/// in cranelift-codegen 0.135.8), those through a GOT or PLT only with
/// `is_pic`, those of thread-local storage only with the matching
/// `tls_model`. An entry with any other kind is not used (see 1 above):
/// cranelift-jit panics on GOT kinds (it requires `is_pic` off) and on
/// kinds it does not know, cranelift-object on kinds its file format cannot
/// express.
pub fn emitted_on(isa: &dyn TargetIsa, kind: Reloc) -> bool {
    let architecture = isa.triple().architecture;
    let (x86_64, aarch64) = (
        architecture == Architecture::X86_64,
        matches!(architecture, Architecture::Aarch64(_)),
    );
    let pic = isa.flags().is_pic();
    let tls = isa.flags().tls_model();
    match kind {
        Reloc::Abs8 => true,
        // Pointer-sized on 32-bit targets only (Pulley's).
        Reloc::Abs4 => isa.pointer_bits() == 32,
        Reloc::X86PCRel4 | Reloc::X86CallPCRel4 => x86_64,
        Reloc::X86CallPLTRel4 | Reloc::X86GOTPCRel4 => x86_64 && pic,
        Reloc::ElfX86_64TlsGd => x86_64 && tls == TlsModel::ElfGd,
        Reloc::MachOX86_64Tlv => x86_64 && tls == TlsModel::Macho,
        Reloc::X86SecRel => x86_64 && tls == TlsModel::Coff,
        Reloc::Arm64Call | Reloc::Aarch64AdrPrelPgHi21 | Reloc::Aarch64AddAbsLo12Nc => aarch64,
        Reloc::Aarch64AdrGotPage21 | Reloc::Aarch64Ld64GotLo12Nc => aarch64 && pic,
        Reloc::Aarch64TlsDescAdrPage21
        | Reloc::Aarch64TlsDescLd64Lo12
        | Reloc::Aarch64TlsDescAddLo12
        | Reloc::Aarch64TlsDescCall => aarch64 && tls == TlsModel::ElfGd,
        Reloc::MachOAarch64TlsAdrPage21 | Reloc::MachOAarch64TlsAdrPageOff12 => {
            aarch64 && tls == TlsModel::Macho
        }
        Reloc::RiscvCallPlt
        | Reloc::RiscvTlsGdHi20
        | Reloc::RiscvPCRelLo12I
        | Reloc::RiscvGotHi20
        | Reloc::RiscvPCRelHi20 => matches!(architecture, Architecture::Riscv64(_)),
        Reloc::S390xPCRel32Dbl
        | Reloc::S390xPLTRel32Dbl
        | Reloc::S390xTlsGd64
        | Reloc::S390xTlsGdCall => architecture == Architecture::S390x,
        Reloc::PulleyPcRel | Reloc::PulleyCallIndirectHost => matches!(
            architecture,
            Architecture::Pulley32
                | Architecture::Pulley64
                | Architecture::Pulley32be
                | Architecture::Pulley64be
        ),
        // No backend of Cranelift 0.135.8 targets 32-bit Arm.
        Reloc::Arm32Call => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code::{RelocTarget, Relocation};
    use crate::compile::compile;
    use crate::plan::Walk;
    use crate::store::MemoryStore;
    use crate::{Fingerprinter, Template};
    use cranelift_codegen::isa::OwnedTargetIsa;
    use cranelift_codegen::settings;
    use std::sync::Mutex;

    const F: &str = "function %f(i64) -> i64 {
    sig0 = (i64) -> i64
    fn0 = u0:1 sig0
block0(v0: i64):
    v1 = iconst.i64 7
    v2 = iadd v0, v1
    v3 = call fn0(v2)
    return v3
}";

    /// `F`'s template and names, its code for the host, and the entry of
    /// `code` (its code where `None`) encoded for the host's context.
    struct Fixture {
        template: Template,
        names: Vec<SymbolName>,
        code: MachineCode,
        isa: OwnedTargetIsa,
        context: CodeContext,
    }

    /// The ISA named `name` with Cranelift's default flags (as a JIT's:
    /// not PIC).
    fn isa_named(name: &str) -> OwnedTargetIsa {
        cranelift_codegen::isa::lookup_by_name(name)
            .unwrap()
            .finish(settings::Flags::new(settings::builder()))
            .unwrap()
    }

    fn fixture() -> Fixture {
        let func = cranelift_reader::parse_functions(F).unwrap().remove(0);
        let isa = isa_named("x86_64");
        let walk = Walk::of(&mut Fingerprinter::new(), &func);
        let code = compile(&func, &*isa).unwrap().code;
        let context = CodeContext::of(&*isa);
        Fixture {
            template: walk.fingerprint.to_template(),
            names: walk.names,
            code,
            isa,
            context,
        }
    }

    impl Fixture {
        fn checks(&self) -> Checks<'_> {
            Checks {
                context: &self.context,
                secret: None,
                isa: &*self.isa,
                needs_unwind: false,
            }
        }

        fn entry(&self, code: &MachineCode) -> Vec<u8> {
            Entry::new(&self.template, &self.names, code, Duration::ZERO, None)
                .unwrap()
                .encode(&self.context, None)
        }
    }

    #[test]
    fn an_entry_that_passes_every_check_is_its_code() {
        let f = fixture();
        let loaded = check(&f.entry(&f.code), &f.checks(), f.template.key(), &f.names).unwrap();
        assert_eq!(loaded.code, f.code);
    }

    #[test]
    fn an_alignment_no_compile_gives_is_rejected() {
        let f = fixture();
        let mut code = f.code.clone();
        code.alignment = 4096;
        let result = check(&f.entry(&code), &f.checks(), f.template.key(), &f.names);
        assert_eq!(result.unwrap_err(), Rejection::Alignment(4096));
    }

    #[test]
    fn a_relocation_kind_the_isa_never_emits_is_rejected() {
        let f = fixture();
        let mut code = f.code.clone();
        // Through the GOT: emitted only with `is_pic`, which the JIT's
        // flags leave off.
        code.relocs.push(Relocation {
            offset: 0,
            kind: Reloc::X86GOTPCRel4,
            addend: 0,
            target: RelocTarget::Name(f.names[0].clone()),
        });
        let result = check(&f.entry(&code), &f.checks(), f.template.key(), &f.names);
        assert_eq!(
            result.unwrap_err(),
            Rejection::RelocationKind(Reloc::X86GOTPCRel4)
        );
    }

    #[test]
    fn names_other_than_the_entrys_are_rejected() {
        let f = fixture();
        let result = check(&f.entry(&f.code), &f.checks(), f.template.key(), &[]);
        assert_eq!(result.unwrap_err(), Rejection::Names);
    }

    #[test]
    fn another_context_is_the_entrys_rejection() {
        let f = fixture();
        let aarch64 = isa_named("aarch64");
        let other = CodeContext::of(&*aarch64);
        let checks = Checks {
            context: &other,
            ..f.checks()
        };
        let result = check(&f.entry(&f.code), &checks, f.template.key(), &f.names);
        assert_eq!(
            result.unwrap_err(),
            Rejection::Entry(EntryRejected::OtherContext)
        );
    }

    /// A store that reserves every key it does not hold, and records how
    /// each reservation ended.
    #[derive(Default)]
    struct Reserving {
        held: MemoryStore,
        ended: Mutex<Vec<&'static str>>,
    }

    impl CodeStore for Reserving {
        fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
            self.held.get(key)
        }
        fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
            self.ended.lock().unwrap().push("put");
            self.held.put(key, value)
        }
        fn reserves(&self) -> bool {
            true
        }
        fn release(&self, _: &StoreKey) {
            self.ended.lock().unwrap().push("release");
        }
    }

    #[test]
    fn a_reservation_ends_once_with_a_put_or_when_dropped() {
        let f = fixture();
        let reserving = Arc::new(Reserving::default());
        let store: Arc<dyn CodeStore> = reserving.clone();
        let key = StoreKey::of(&f.context, &f.template);
        let miss = |source| load(&store, key, source, &f.checks(), f.template.key(), &f.names);
        // Dropped unused: released.
        let Err(Miss::Reserved(reservation)) = miss(Source::Ask) else {
            panic!("reserved");
        };
        assert_eq!(reservation.key(), key);
        drop(reservation);
        assert_eq!(*reserving.ended.lock().unwrap(), ["release"]);
        // Fetched by a batch as missing: asked again, to reserve it; then
        // ended with the entry, and not released after.
        let Err(Miss::Reserved(reservation)) = miss(Source::Fetched(None)) else {
            panic!("reserved");
        };
        reservation.put(&f.entry(&f.code)).unwrap();
        assert_eq!(*reserving.ended.lock().unwrap(), ["release", "put"]);
        let loaded = miss(Source::Ask).unwrap();
        assert_eq!(loaded.code, f.code);
    }

    /// A store whose writes all fail, ending nothing.
    struct Unwritable(Reserving);

    impl CodeStore for Unwritable {
        fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
            self.0.get(key)
        }
        fn put(&self, _: &StoreKey, _: &[u8]) -> Result<(), StoreError> {
            Err(StoreError::TooLarge { len: 1, limit: 0 })
        }
        fn reserves(&self) -> bool {
            true
        }
        fn release(&self, key: &StoreKey) {
            self.0.release(key)
        }
    }

    #[test]
    fn a_write_ends_its_reservations_or_releases_them_if_it_fails() {
        let f = fixture();
        let key = StoreKey::of(&f.context, &f.template);
        let other = StoreKey::from_bytes([7; 16]);
        let entries = |store: &Arc<dyn CodeStore>| {
            [key, other]
                .into_iter()
                .map(|key| {
                    let Ok(Claimed::Reserved(reservation)) = claim(store, key) else {
                        panic!("reserved");
                    };
                    Unwritten {
                        key,
                        value: f.entry(&f.code),
                        reservation: Some(reservation),
                    }
                })
                .collect::<Vec<_>>()
        };
        let reserving = Arc::new(Reserving::default());
        let store: Arc<dyn CodeStore> = reserving.clone();
        assert_eq!(write(&store, entries(&store)).unwrap(), 2);
        // Two puts, no release.
        assert_eq!(*reserving.ended.lock().unwrap(), ["put", "put"]);
        assert!(
            load(
                &store,
                key,
                Source::Ask,
                &f.checks(),
                f.template.key(),
                &f.names
            )
            .is_ok()
        );
        let unwritable = Arc::new(Unwritable(Reserving::default()));
        let store: Arc<dyn CodeStore> = unwritable.clone();
        assert!(write(&store, entries(&store)).is_err());
        assert_eq!(*unwritable.0.ended.lock().unwrap(), ["release", "release"]);
    }

    #[test]
    fn a_store_that_does_not_reserve_misses_what_a_batch_found_missing() {
        let f = fixture();
        let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
        let key = StoreKey::of(&f.context, &f.template);
        let result = load(
            &store,
            key,
            Source::Fetched(None),
            &f.checks(),
            f.template.key(),
            &f.names,
        );
        assert!(matches!(result, Err(Miss::Absent)), "{result:?}");
        // Asked, it may have reserved (dropping the guard releases: a
        // no-op here).
        let result = load(
            &store,
            key,
            Source::Ask,
            &f.checks(),
            f.template.key(),
            &f.names,
        );
        assert!(matches!(result, Err(Miss::Reserved(_))), "{result:?}");
        // Bytes a batch fetched are checked as any others.
        let fetched = Source::Fetched(Some(b"not an entry".to_vec()));
        let result = load(
            &store,
            key,
            fetched,
            &f.checks(),
            f.template.key(),
            &f.names,
        );
        assert!(
            matches!(result, Err(Miss::Rejected(Rejection::Entry(_)))),
            "{result:?}"
        );
    }
}
