//! What a stored compiled template is, and its binary format.
//!
//! An [`Entry`] is the code Cranelift compiled for one function, with its
//! relocations against the function's names given by *slot* (the name's
//! index in the function's name list, see [`crate::Walk::names`]), so that
//! one entry serves every function with that [template](crate::Template)
//! in any process: [`Entry::code`] gives the code for another function's
//! names.
//!
//! # Format (version [`FORMAT_VERSION`])
//!
//! All integers little-endian.
//!
//! | bytes | what |
//! | --- | --- |
//! | 8 | magic `JFCODE\r\n` |
//! | 2 | format version |
//! | 2 | flags: bit 0 set when a MAC ends the entry, bit 1 when the entry holds a verified function's digests; no other bit is used |
//! | 32 | [`CodeContext::digest`] |
//! | 32 | [`template_digest`] of the template key words (BLAKE3, derived key) |
//! | 32 | [`template_sha256`] of the template key words (zeros for a key of [`SHA256_BELOW`] bytes or more, which no reader checks by it) |
//! | 4 | number of names (slots) of the function |
//! | 4 | code alignment (a power of two) |
//! | 8 | compile time, nanoseconds |
//! | 4 + n | code length, code bytes |
//! | 4 + 18·n | number of relocations; each: offset (4), kind (1), target kind (1), addend (8), target (4: slot, own offset, libcall or known symbol number) |
//! | 1 [+ 4 + n] | unwind information: 0 none, 1 present (length, postcard bytes of Cranelift's `UnwindInfo`), 2 left out |
//! | 64 | with flag bit 1: the [verified function's digests](Entry::verified), BLAKE3's then SHA-256's |
//! | 16 | XXH3-128 of every byte before it |
//! | 32 | with flag bit 0: keyed BLAKE3 of every byte before it, keyed with the [`Secret`] |
//!
//! Relocation kinds, libcalls and known symbols are numbered by one table
//! each (`codes!` below), from which both directions are generated; the
//! Cranelift-to-number direction is an exhaustive `match`, so a new
//! Cranelift variant is a compile error until it is given a number.
//!
//! # What this module guarantees
//!
//! [`Entry::decode`] returns an entry only if every check below passes,
//! and otherwise says which failed ([`EntryRejected`]); it never panics.
//!
//! 1. The bytes are exactly one entry of this format version: magic,
//!    version, known flags, every length within the bytes, no byte left
//!    over, and the checksum matches (so truncation and accidental
//!    corruption are rejected).
//! 2. With a secret, the entry carries a MAC and the MAC is that of the
//!    secret over the whole entry (compared in constant time). Without
//!    one, an entry's MAC is not checked (and cannot be).
//! 3. The entry is for the expected context and the expected template:
//!    equal context digests and, of the template's two digests, equal
//!    ones by the one this reader checks, so a
//!    [`StoreKey`](super::StoreKey) collision, or an entry copied under
//!    another entry's key, is rejected. The template is held as two
//!    digests, not its words (which took more bytes than the code, 1,041
//!    of 1,928 per entry on the SQLite corpus): BLAKE3's and SHA-256's,
//!    of which a reader checks one ([`checks_by_sha256`] says which; a
//!    writer leaves SHA-256's out, as zeros, for a key of
//!    [`SHA256_BELOW`] bytes or more, which every reader checks by
//!    BLAKE3): finding two templates with one digest is as hard as
//!    breaking that hash's collision resistance (BLAKE3's is the
//!    property a MAC over the entry relies on already). Why two: a reader
//!    on a CPU with SHA-256 instructions computes SHA-256 up to twice as
//!    fast as BLAKE3 on a key under 6 KiB (BLAKE3 hashes one 1 KiB chunk
//!    at a time, and only several chunks at once with SIMD), and a reader
//!    without them computes it about three times slower; the format
//!    cannot depend on the reader's CPU, so it carries both (32 bytes an
//!    entry) and each reader takes its faster. [`SHA256_BELOW`] is part of
//!    the format: changing it needs a new [`FORMAT_VERSION`].
//! 4. The code is well-formed for defining: the alignment is a power of
//!    two, every relocation is a known kind and target, every slot is below
//!    the number of names, every relocation's patched bytes and every own
//!    offset lie within the code.
//!
//! # Unwind information
//!
//! Cranelift's `UnwindInfo` has private fields and is serializable only
//! with its `enable-serde` feature. With jitfold's `store-unwind` feature,
//! entries carry it (postcard bytes; the Cranelift version in the context
//! pins the serde layout) as [`EntryUnwind::Info`]. Without it, an entry
//! of code that had unwind information records only that it was left out
//! ([`EntryUnwind::Omitted`]); an entry with it, written by a build with
//! the feature, decodes the same way. Code defined where frame
//! descriptions are written (an object file with unwind information) must
//! not come from an entry whose unwind information is `Omitted`; a JIT
//! module, which registers no unwind information, can use any entry.

use super::key::CodeContext;
use crate::code::{MachineCode, RelocTarget, Relocation};
use crate::fingerprint::{SymbolName, Template};
use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::ir::{KnownSymbol, LibCall};
use cranelift_codegen::isa::unwind::UnwindInfo;
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

/// The version of the entry format this build reads and writes; entries
/// of another version are rejected, and it is hashed into every
/// [`StoreKey`](super::StoreKey) so that they are not even found. (4: a
/// verified function's digest may follow the unwind information; 5: the
/// [`template_digest`] hashes the word count after the words; 6: the
/// [`template_sha256`] follows it, and a verified function's digests are
/// a [`Digests`] pair.)
pub const FORMAT_VERSION: u16 = 6;

const MAGIC: &[u8; 8] = b"JFCODE\r\n";
/// Flag bit: a MAC ends the entry.
const FLAG_MAC: u16 = 1;
/// Flag bit: the entry holds a verified function's digests.
const FLAG_VERIFIED: u16 = 2;
const CHECKSUM_BYTES: usize = 16;
const MAC_BYTES: usize = 32;
/// Bytes of one relocation record.
const RELOC_BYTES: usize = 4 + 1 + 1 + 8 + 4;

/// The key of the MAC that entries carry when a store is shared with
/// writers that should not be trusted. Keep it like a signing key: whoever
/// holds it can make entries every process with it will run.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl Secret {
    /// A secret given as 32 bytes (which should be uniformly random).
    pub fn new(key: [u8; 32]) -> Self {
        Self(key)
    }

    /// A secret derived from `material` of any length (a key file's
    /// contents, say) with BLAKE3's key derivation. As strong as the
    /// material is unpredictable: a password-like material can be guessed.
    pub fn derive(material: &[u8]) -> Self {
        Self(blake3::derive_key("jitfold code store entry MAC", material))
    }

    fn mac(&self, bytes: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, bytes)
    }
}

impl Drop for Secret {
    /// Overwrites this copy of the key, so that it does not stay in the
    /// memory it is freed from. (Copies made before, such as the array
    /// given to [`Secret::new`] or a value moved from, are not reached.)
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key itself.
        f.write_str("Secret(..)")
    }
}

/// What a relocation of an entry points at: a name by slot, or a target
/// that does not depend on the function's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryTarget {
    /// The name in this slot of the function's name list.
    Slot(u32),
    /// A libcall.
    LibCall(LibCall),
    /// A well-known symbol.
    KnownSymbol(KnownSymbol),
    /// An offset inside the function's own code.
    OwnOffset(u32),
}

/// One relocation of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryReloc {
    /// Where in the code.
    pub offset: u32,
    /// How to patch it.
    pub kind: Reloc,
    /// Added to the target's address.
    pub addend: i64,
    /// What it refers to.
    pub target: EntryTarget,
}

/// The unwind information of an entry's code (see the [module
/// docs](self#unwind-information)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryUnwind {
    /// The ISA gave none for this code.
    None,
    /// Cranelift's unwind information (feature `store-unwind`).
    Info(UnwindInfo),
    /// The code had unwind information, which this entry does not carry.
    Omitted,
}

/// A compiled template, as stored: see the [module docs](self).
///
/// Holds the invariants [`Entry::decode`] checks (4 in the module docs),
/// whether it was decoded or built with [`Entry::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    template: Digests,
    slots: u32,
    bytes: Vec<u8>,
    alignment: u32,
    relocs: Vec<EntryReloc>,
    compile_time: Duration,
    unwind: EntryUnwind,
    verified: Option<Digests>,
}

/// A BLAKE3 and a SHA-256 digest of one input, as an entry carries its
/// template's and a verified function's: both written (SHA-256's only
/// where a reader may check it, an input under [`SHA256_BELOW`] bytes;
/// zeros otherwise), one checked: SHA-256's where [`checks_by_sha256`]
/// says so for the input's length, else BLAKE3's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digests {
    /// The BLAKE3 digest.
    pub blake3: [u8; 32],
    /// The SHA-256 digest.
    pub sha256: [u8; 32],
}

impl Digests {
    /// Whether the input of `len` bytes whose digests `blake3` and
    /// `sha256` compute is the one these are digests of: by SHA-256 where
    /// [`checks_by_sha256`] says so for `len`, else by BLAKE3 (only the
    /// digest compared is computed).
    pub(crate) fn matches(
        &self,
        len: usize,
        blake3: impl FnOnce() -> [u8; 32],
        sha256: impl FnOnce() -> [u8; 32],
    ) -> bool {
        self.matches_by(checks_by_sha256(len), blake3, sha256)
    }

    /// As [`Digests::matches`], by SHA-256 if `by_sha256`, else by BLAKE3.
    fn matches_by(
        &self,
        by_sha256: bool,
        blake3: impl FnOnce() -> [u8; 32],
        sha256: impl FnOnce() -> [u8; 32],
    ) -> bool {
        if by_sha256 {
            sha256() == self.sha256
        } else {
            blake3() == self.blake3
        }
    }

    /// The digests of the template whose key words are `words`.
    pub(crate) fn of_template(words: &[u32]) -> Self {
        Self::of(
            template_len(words),
            || template_digest(words),
            || template_sha256(words),
        )
    }

    /// Whether these are the digests of the template whose key words are
    /// `words` ([`Digests::matches`], measured as [`Digests::of_template`]
    /// measures them).
    pub(crate) fn matches_template(&self, words: &[u32]) -> bool {
        self.matches(
            template_len(words),
            || template_digest(words),
            || template_sha256(words),
        )
    }

    /// The digests of an input of `len` bytes, computed by `blake3` and
    /// `sha256`: SHA-256's only where a reader may check it, an input
    /// shorter than [`SHA256_BELOW`] (zeros otherwise, never read), so
    /// that a writer pays for it only where it is cheap.
    pub(crate) fn of(
        len: usize,
        blake3: impl FnOnce() -> [u8; 32],
        sha256: impl FnOnce() -> [u8; 32],
    ) -> Self {
        Self {
            blake3: blake3(),
            sha256: if len < SHA256_BELOW {
                sha256()
            } else {
                [0; 32]
            },
        }
    }
}

/// Why bytes were not accepted as an entry (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryRejected {
    /// Shorter than the lengths it gives.
    Truncated,
    /// Bytes left over after the entry.
    TrailingBytes,
    /// Not an entry (wrong magic).
    BadMagic,
    /// An entry of another format version.
    OtherVersion(u16),
    /// Flags this version does not know.
    UnknownFlags(u16),
    /// The checksum does not match.
    Checksum,
    /// A secret is set and the entry has no MAC.
    MacMissing,
    /// The MAC is not the secret's over this entry.
    MacInvalid,
    /// The entry is for code compiled in another context.
    OtherContext,
    /// The entry is for another template: a key collision, or an entry
    /// stored under another entry's key.
    OtherTemplate,
    /// The code alignment is not a power of two.
    BadAlignment(u32),
    /// A relocation kind with no number in this format.
    BadRelocKind(u8),
    /// A relocation target kind with no number in this format.
    BadTargetKind(u8),
    /// A libcall with no number in this format.
    BadLibCall(u32),
    /// A known symbol with no number in this format.
    BadKnownSymbol(u32),
    /// A relocation against a slot the function does not have.
    SlotOutOfRange {
        /// The slot.
        slot: u32,
        /// How many names the function has.
        slots: u32,
    },
    /// A relocation whose patched bytes, or whose own-code target, are
    /// not within the code.
    OutsideCode {
        /// The relocation's offset.
        offset: u32,
    },
    /// The unwind information does not decode.
    BadUnwind,
}

impl fmt::Display for EntryRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => write!(f, "entry is truncated"),
            Self::TrailingBytes => write!(f, "bytes after the end of the entry"),
            Self::BadMagic => write!(f, "not a jitfold code entry"),
            Self::OtherVersion(v) => write!(
                f,
                "entry format version {v}, this build reads {FORMAT_VERSION}"
            ),
            Self::UnknownFlags(flags) => write!(f, "unknown entry flags {flags:#x}"),
            Self::Checksum => write!(f, "entry checksum does not match"),
            Self::MacMissing => write!(f, "a secret is set and the entry has no MAC"),
            Self::MacInvalid => write!(f, "entry MAC is not valid for the secret"),
            Self::OtherContext => write!(f, "entry is for another ISA, flags or version"),
            Self::OtherTemplate => write!(f, "entry is for another template"),
            Self::BadAlignment(a) => write!(f, "code alignment {a} is not a power of two"),
            Self::BadRelocKind(k) => write!(f, "unknown relocation kind {k}"),
            Self::BadTargetKind(k) => write!(f, "unknown relocation target kind {k}"),
            Self::BadLibCall(n) => write!(f, "unknown libcall {n}"),
            Self::BadKnownSymbol(n) => write!(f, "unknown known symbol {n}"),
            Self::SlotOutOfRange { slot, slots } => {
                write!(f, "relocation against slot {slot} of {slots} names")
            }
            Self::OutsideCode { offset } => {
                write!(f, "relocation at {offset} reaches outside the code")
            }
            Self::BadUnwind => write!(f, "unwind information does not decode"),
        }
    }
}

impl std::error::Error for EntryRejected {}

impl Entry {
    /// The entry of `code`, compiled in `compile_time` for a function with
    /// `template` and `names` in slot order, and `unwind` information.
    /// `None` if a relocation is against a name not in `names` (such code
    /// cannot be retargeted), if `names` has more than `u32::MAX` names, or
    /// if the code breaks an invariant `decode` checks (4 in the module
    /// docs), which compiled code does not.
    pub fn new(
        template: &Template,
        names: &[SymbolName],
        code: &MachineCode,
        compile_time: Duration,
        unwind: Option<&UnwindInfo>,
    ) -> Option<Self> {
        let relocs = code
            .relocs
            .iter()
            .map(|r| {
                let target = match &r.target {
                    RelocTarget::Name(name) => {
                        EntryTarget::Slot(names.iter().position(|n| n == name)?.try_into().ok()?)
                    }
                    RelocTarget::LibCall(libcall) => EntryTarget::LibCall(*libcall),
                    RelocTarget::KnownSymbol(symbol) => EntryTarget::KnownSymbol(*symbol),
                    RelocTarget::OwnOffset(offset) => EntryTarget::OwnOffset(*offset),
                };
                Some(EntryReloc {
                    offset: r.offset,
                    kind: r.kind,
                    addend: r.addend,
                    target,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let entry = Self {
            template: Digests::of_template(template.key()),
            slots: names.len().try_into().ok()?,
            bytes: code.bytes.clone(),
            alignment: code.alignment,
            relocs,
            compile_time,
            unwind: match unwind {
                None => EntryUnwind::None,
                #[cfg(feature = "store-unwind")]
                Some(info) => EntryUnwind::Info(info.clone()),
                #[cfg(not(feature = "store-unwind"))]
                Some(_) => EntryUnwind::Omitted,
            },
            verified: None,
        };
        entry.check_code().ok()?;
        Some(entry)
    }

    /// The code of the function with this template and `names` in slot
    /// order: the entry's bytes and relocations, with relocations by slot
    /// against `names[slot]`. `None` if `names` is not as long as the
    /// name list the entry was made with.
    pub fn code(&self, names: &[SymbolName]) -> Option<MachineCode> {
        if names.len() != self.slots as usize {
            return None;
        }
        let relocs = self
            .relocs
            .iter()
            .map(|r| Relocation {
                offset: r.offset,
                kind: r.kind,
                addend: r.addend,
                target: match r.target {
                    EntryTarget::Slot(slot) => RelocTarget::Name(names[slot as usize].clone()),
                    EntryTarget::LibCall(libcall) => RelocTarget::LibCall(libcall),
                    EntryTarget::KnownSymbol(symbol) => RelocTarget::KnownSymbol(symbol),
                    EntryTarget::OwnOffset(offset) => RelocTarget::OwnOffset(offset),
                },
            })
            .collect();
        Some(MachineCode {
            bytes: self.bytes.clone(),
            alignment: self.alignment,
            relocs,
        })
    }

    /// The [`template_digest`] of the template's key words.
    pub fn template_digest(&self) -> &[u8; 32] {
        &self.template.blake3
    }

    /// The [`template_sha256`] of the template's key words.
    pub fn template_sha256(&self) -> &[u8; 32] {
        &self.template.sha256
    }

    /// How many names (slots) the function has.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// The code bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The alignment the code asks for (a power of two).
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// The relocations, in order, by slot.
    pub fn relocs(&self) -> &[EntryReloc] {
        &self.relocs
    }

    /// What compiling the code cost when it was compiled: what a hit saves.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The code's unwind information.
    pub fn unwind(&self) -> &EntryUnwind {
        &self.unwind
    }

    /// This entry, holding `digest`: the digests of the function its code
    /// was compiled from, by a compile that ran Cranelift's checks on it
    /// (the verifier, as the entry's context's flags say). What the
    /// digests cover, and so what a reader may skip when a function's
    /// digest is equal, is the writer's and reader's contract (a
    /// `DedupModule`'s: see `verify.rs` in `src/module/`); the entry only
    /// carries them, under its checksum and MAC.
    pub fn with_verified(self, digest: Digests) -> Self {
        Self {
            verified: Some(digest),
            ..self
        }
    }

    /// The digests of the function the code was compiled from, where the
    /// writer recorded them ([`Entry::with_verified`]).
    pub fn verified(&self) -> Option<&Digests> {
        self.verified.as_ref()
    }

    /// The entry's bytes in `context`, with a MAC when `secret` is given
    /// (see the format in the [module docs](self)).
    pub fn encode(&self, context: &CodeContext, secret: Option<&Secret>) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.bytes.len() + self.relocs.len() * RELOC_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        let mut flags = if secret.is_some() { FLAG_MAC } else { 0 };
        if self.verified.is_some() {
            flags |= FLAG_VERIFIED;
        }
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(context.digest());
        out.extend_from_slice(&self.template.blake3);
        out.extend_from_slice(&self.template.sha256);
        out.extend_from_slice(&self.slots.to_le_bytes());
        out.extend_from_slice(&self.alignment.to_le_bytes());
        let nanos = u64::try_from(self.compile_time.as_nanos()).unwrap_or(u64::MAX);
        out.extend_from_slice(&nanos.to_le_bytes());
        put_len(&mut out, self.bytes.len());
        out.extend_from_slice(&self.bytes);
        put_len(&mut out, self.relocs.len());
        for r in &self.relocs {
            out.extend_from_slice(&r.offset.to_le_bytes());
            out.push(reloc_code(r.kind));
            let (target_kind, target) = match r.target {
                EntryTarget::Slot(slot) => (TARGET_SLOT, slot),
                EntryTarget::LibCall(libcall) => (TARGET_LIBCALL, u32::from(libcall_code(libcall))),
                EntryTarget::KnownSymbol(symbol) => {
                    (TARGET_KNOWN_SYMBOL, u32::from(known_symbol_code(symbol)))
                }
                EntryTarget::OwnOffset(offset) => (TARGET_OWN_OFFSET, offset),
            };
            out.push(target_kind);
            out.extend_from_slice(&r.addend.to_le_bytes());
            out.extend_from_slice(&target.to_le_bytes());
        }
        match &self.unwind {
            EntryUnwind::None => out.push(UNWIND_NONE),
            EntryUnwind::Info(info) => match unwind_bytes(info) {
                Some(bytes) => {
                    out.push(UNWIND_INFO);
                    put_len(&mut out, bytes.len());
                    out.extend_from_slice(&bytes);
                }
                None => out.push(UNWIND_OMITTED),
            },
            EntryUnwind::Omitted => out.push(UNWIND_OMITTED),
        }
        if let Some(digests) = &self.verified {
            out.extend_from_slice(&digests.blake3);
            out.extend_from_slice(&digests.sha256);
        }
        let checksum = xxhash_rust::xxh3::xxh3_128(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        if let Some(secret) = secret {
            let mac = secret.mac(&out);
            out.extend_from_slice(mac.as_bytes());
        }
        out
    }

    /// The entry in `bytes`, if it passes every check of the [module
    /// docs](self) for code of `expected` in `context`, with `secret` if
    /// one is set; otherwise which check failed.
    pub fn decode(
        bytes: &[u8],
        context: &CodeContext,
        expected: &Template,
        secret: Option<&Secret>,
    ) -> Result<Self, EntryRejected> {
        Self::decode_words(bytes, context, expected.key(), secret)
    }

    /// As [`Entry::decode`], for the template whose key words are
    /// `expected`.
    pub fn decode_words(
        bytes: &[u8],
        context: &CodeContext,
        expected: &[u32],
        secret: Option<&Secret>,
    ) -> Result<Self, EntryRejected> {
        let header = MAGIC.len() + 4;
        if bytes.len() < header {
            // A prefix of the magic is a truncated entry; anything else is
            // not an entry.
            let n = bytes.len().min(MAGIC.len());
            return Err(if bytes[..n] == MAGIC[..n] {
                EntryRejected::Truncated
            } else {
                EntryRejected::BadMagic
            });
        }
        if bytes[..MAGIC.len()] != MAGIC[..] {
            return Err(EntryRejected::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != FORMAT_VERSION {
            return Err(EntryRejected::OtherVersion(version));
        }
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        if flags & !(FLAG_MAC | FLAG_VERIFIED) != 0 {
            return Err(EntryRejected::UnknownFlags(flags));
        }
        let has_mac = flags & FLAG_MAC != 0;
        let trailer = CHECKSUM_BYTES + if has_mac { MAC_BYTES } else { 0 };
        if bytes.len() < header + trailer {
            return Err(EntryRejected::Truncated);
        }
        let (checked, mac) = bytes.split_at(bytes.len() - if has_mac { MAC_BYTES } else { 0 });
        let (body, checksum) = checked.split_at(checked.len() - CHECKSUM_BYTES);
        let checksum = u128::from_le_bytes(checksum.try_into().expect("16 bytes"));
        if xxhash_rust::xxh3::xxh3_128(body) != checksum {
            return Err(EntryRejected::Checksum);
        }
        if let Some(secret) = secret {
            if !has_mac {
                return Err(EntryRejected::MacMissing);
            }
            let mac: [u8; MAC_BYTES] = mac.try_into().expect("32 bytes");
            // `blake3::Hash`'s equality is constant-time.
            if secret.mac(checked) != blake3::Hash::from_bytes(mac) {
                return Err(EntryRejected::MacInvalid);
            }
        }
        let mut reader = Reader {
            bytes: &body[header..],
        };
        if reader.take(32)? != context.digest() {
            return Err(EntryRejected::OtherContext);
        }
        let template = reader.digests()?;
        if !template.matches_template(expected) {
            return Err(EntryRejected::OtherTemplate);
        }
        let slots = reader.u32()?;
        let alignment = reader.u32()?;
        let compile_time = Duration::from_nanos(reader.u64()?);
        let code_len = reader.len(1)?;
        let code = reader.take(code_len)?.to_vec();
        let count = reader.len(RELOC_BYTES)?;
        let mut relocs = Vec::with_capacity(count);
        for _ in 0..count {
            let offset = reader.u32()?;
            let kind_code = reader.u8()?;
            let kind = reloc_of_code(kind_code).ok_or(EntryRejected::BadRelocKind(kind_code))?;
            let target_kind = reader.u8()?;
            let addend = reader.u64()? as i64;
            let target = reader.u32()?;
            let target = match target_kind {
                TARGET_SLOT => EntryTarget::Slot(target),
                TARGET_LIBCALL => EntryTarget::LibCall(
                    u8::try_from(target)
                        .ok()
                        .and_then(libcall_of_code)
                        .ok_or(EntryRejected::BadLibCall(target))?,
                ),
                TARGET_KNOWN_SYMBOL => EntryTarget::KnownSymbol(
                    u8::try_from(target)
                        .ok()
                        .and_then(known_symbol_of_code)
                        .ok_or(EntryRejected::BadKnownSymbol(target))?,
                ),
                TARGET_OWN_OFFSET => EntryTarget::OwnOffset(target),
                other => return Err(EntryRejected::BadTargetKind(other)),
            };
            relocs.push(EntryReloc {
                offset,
                kind,
                addend,
                target,
            });
        }
        let unwind = match reader.u8()? {
            UNWIND_NONE => EntryUnwind::None,
            UNWIND_INFO => {
                let len = reader.len(1)?;
                unwind_of_bytes(reader.take(len)?)?
            }
            UNWIND_OMITTED => EntryUnwind::Omitted,
            _ => return Err(EntryRejected::BadUnwind),
        };
        let verified = if flags & FLAG_VERIFIED != 0 {
            Some(reader.digests()?)
        } else {
            None
        };
        if !reader.bytes.is_empty() {
            return Err(EntryRejected::TrailingBytes);
        }
        let entry = Self {
            template,
            slots,
            bytes: code,
            alignment,
            relocs,
            compile_time,
            unwind,
            verified,
        };
        entry.check_code()?;
        Ok(entry)
    }

    /// Invariant 4 of the module docs.
    fn check_code(&self) -> Result<(), EntryRejected> {
        if !self.alignment.is_power_of_two() {
            return Err(EntryRejected::BadAlignment(self.alignment));
        }
        let len = self.bytes.len() as u64;
        for r in &self.relocs {
            let outside = EntryRejected::OutsideCode { offset: r.offset };
            if u64::from(r.offset) + u64::from(patched_bytes(r.kind)) > len {
                return Err(outside);
            }
            match r.target {
                EntryTarget::Slot(slot) if slot >= self.slots => {
                    return Err(EntryRejected::SlotOutOfRange {
                        slot,
                        slots: self.slots,
                    });
                }
                EntryTarget::OwnOffset(offset) if u64::from(offset) > len => return Err(outside),
                EntryTarget::Slot(_)
                | EntryTarget::OwnOffset(_)
                | EntryTarget::LibCall(_)
                | EntryTarget::KnownSymbol(_) => {}
            }
        }
        Ok(())
    }
}

/// Appends a length as a `u32` (entries are far below 4 GiB: Cranelift's
/// code offsets are `u32`).
fn put_len(out: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).expect("entry parts are shorter than 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
}

/// The BLAKE3 digest of the two an entry holds of the template whose key
/// words are `words` (see [`Digests`]): BLAKE3 in key derivation mode (context `"jitfold template
/// digest"`) over the words, then the word count (`u64`), little-endian.
/// (The count comes last, since format 5, so that the words start a
/// BLAKE3 chunk: a key of many chunks is then hashed several chunks at
/// once, where a count first made BLAKE3 hash every eighth chunk alone;
/// a warm start of resvg's functions took 8% less time.)
pub fn template_digest(words: &[u32]) -> [u8; 32] {
    // The hasher as made for the context, cloned: deriving the key from
    // the context anew is a compression per function.
    static FOR_TEMPLATES: LazyLock<blake3::Hasher> =
        LazyLock::new(|| blake3::Hasher::new_derive_key("jitfold template digest"));
    let mut hasher = FOR_TEMPLATES.clone();
    super::key::words_le(words, |piece| {
        hasher.update(piece);
    });
    hasher.update(&(words.len() as u64).to_le_bytes());
    *hasher.finalize().as_bytes()
}

/// The entry's other digest of the template whose key words are `words`:
/// SHA-256 over a 64-byte block naming it (`"jitfold template digest,
/// SHA-256"`, zero-padded), the words, then the word count (`u64`),
/// little-endian. (A block of its own, so that the state after it is
/// computed once and cloned.)
pub fn template_sha256(words: &[u32]) -> [u8; 32] {
    use sha2::Digest;
    static FOR_TEMPLATES: LazyLock<sha2::Sha256> = LazyLock::new(|| {
        let mut block = [0u8; 64];
        let name = b"jitfold template digest, SHA-256";
        block[..name.len()].copy_from_slice(name);
        sha2::Sha256::new_with_prefix(block)
    });
    let mut hasher = FOR_TEMPLATES.clone();
    super::key::words_le(words, |piece| hasher.update(piece));
    hasher.update((words.len() as u64).to_le_bytes());
    hasher.finalize().into()
}

/// Keys of this many bytes or more are checked by their BLAKE3 digest
/// whatever the CPU: from several chunks on, BLAKE3 hashes chunks side by
/// side and overtakes SHA-256 even with SHA-256 instructions. (Measured on
/// this machine, an AMD EPYC with both: over the distinct templates of
/// each wasm corpus, SQLite's took 5.1 ms with BLAKE3 alone and 3.0 ms
/// with SHA-256 below 6 KiB, harfbuzz's 2.0 and 1.2, resvg's 5.0 and 4.2;
/// below 4 KiB or 8 KiB was no better.)
pub const SHA256_BELOW: usize = 6 << 10;

/// Whether this process checks an input of `len` bytes (a template's key
/// words, a verified function's read fields) by its SHA-256 digest rather
/// than its BLAKE3 one: where it is shorter than [`SHA256_BELOW`] bytes
/// and the CPU has SHA-256 instructions that `sha2` uses
/// (on x86-64 only: on aarch64, `sha2` 0.10 uses the SHA-256 extension
/// only with its `asm` feature, which this build leaves off). Either check alone is sound (see 3 in the [module
/// docs](self)); this only picks the faster.
pub fn checks_by_sha256(len: usize) -> bool {
    len < SHA256_BELOW && has_sha256_instructions()
}

/// Whether `sha2` computes SHA-256 with the CPU's instructions here: on
/// x86-64 with SHA, SSE2, SSSE3 and SSE4.1 (the features `sha2` 0.10
/// looks for before it uses them). Elsewhere, never: on aarch64, `sha2`
/// 0.10 uses the SHA-256 extension only with its `asm` feature (which
/// needs an assembler where the crate is built), which this build does not
/// turn on, so SHA-256 there is its portable code, slower than BLAKE3.
fn has_sha256_instructions() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sha")
            && std::arch::is_x86_feature_detected!("sse2")
            && std::arch::is_x86_feature_detected!("ssse3")
            && std::arch::is_x86_feature_detected!("sse4.1")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The length a template's digests are chosen by: its key words' bytes.
fn template_len(words: &[u32]) -> usize {
    words.len().saturating_mul(4)
}

/// Reads the body of an entry, failing with `Truncated` past its end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    /// A [`Digests`] pair: BLAKE3's 32 bytes, then SHA-256's.
    fn digests(&mut self) -> Result<Digests, EntryRejected> {
        Ok(Digests {
            blake3: self.take(32)?.try_into().expect("32 bytes"),
            sha256: self.take(32)?.try_into().expect("32 bytes"),
        })
    }
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EntryRejected> {
        if n > self.bytes.len() {
            return Err(EntryRejected::Truncated);
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, EntryRejected> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, EntryRejected> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64, EntryRejected> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    /// A count of items of `item_bytes` each, checked against the bytes
    /// left so that a bad count allocates nothing.
    fn len(&mut self, item_bytes: usize) -> Result<usize, EntryRejected> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_bytes) > self.bytes.len() {
            return Err(EntryRejected::Truncated);
        }
        Ok(n)
    }
}

const TARGET_SLOT: u8 = 0;
const TARGET_LIBCALL: u8 = 1;
const TARGET_KNOWN_SYMBOL: u8 = 2;
const TARGET_OWN_OFFSET: u8 = 3;

const UNWIND_NONE: u8 = 0;
const UNWIND_INFO: u8 = 1;
const UNWIND_OMITTED: u8 = 2;

#[cfg(feature = "store-unwind")]
fn unwind_bytes(info: &UnwindInfo) -> Option<Vec<u8>> {
    postcard::to_allocvec(info).ok()
}

/// Without `store-unwind`, unwind information is never written (an
/// `Entry` made here never holds `Info`).
#[cfg(not(feature = "store-unwind"))]
fn unwind_bytes(_: &UnwindInfo) -> Option<Vec<u8>> {
    None
}

#[cfg(feature = "store-unwind")]
fn unwind_of_bytes(bytes: &[u8]) -> Result<EntryUnwind, EntryRejected> {
    match postcard::from_bytes(bytes) {
        Ok(info) => Ok(EntryUnwind::Info(info)),
        Err(_) => Err(EntryRejected::BadUnwind),
    }
}

/// Without `store-unwind`, unwind information in an entry is skipped: the
/// code had some, which this build cannot use.
#[cfg(not(feature = "store-unwind"))]
fn unwind_of_bytes(_: &[u8]) -> Result<EntryUnwind, EntryRejected> {
    Ok(EntryUnwind::Omitted)
}

/// Declares the numbering of a Cranelift enum in the entry format: one
/// table from which the exhaustive `match` to numbers and its inverse are
/// generated. A number, once given, is never reused for another variant.
macro_rules! codes {
    ($ty:ident, $to:ident, $of:ident, { $($variant:ident = $code:literal,)* }) => {
        /// The number of a variant in the entry format.
        fn $to(value: $ty) -> u8 {
            // Exhaustive: a new variant is a compile error here.
            match value {
                $($ty::$variant => $code,)*
            }
        }

        /// The variant numbered `code`, if any.
        fn $of(code: u8) -> Option<$ty> {
            match code {
                $($code => Some($ty::$variant),)*
                _ => None,
            }
        }
    };
}

codes!(Reloc, reloc_code, reloc_of_code, {
    Abs4 = 0,
    Abs8 = 1,
    X86PCRel4 = 2,
    X86CallPCRel4 = 3,
    X86CallPLTRel4 = 4,
    X86GOTPCRel4 = 5,
    X86SecRel = 6,
    Arm32Call = 7,
    Arm64Call = 8,
    S390xPCRel32Dbl = 9,
    S390xPLTRel32Dbl = 10,
    ElfX86_64TlsGd = 11,
    MachOX86_64Tlv = 12,
    MachOAarch64TlsAdrPage21 = 13,
    MachOAarch64TlsAdrPageOff12 = 14,
    Aarch64TlsDescAdrPage21 = 15,
    Aarch64TlsDescLd64Lo12 = 16,
    Aarch64TlsDescAddLo12 = 17,
    Aarch64TlsDescCall = 18,
    Aarch64AdrGotPage21 = 19,
    Aarch64AdrPrelPgHi21 = 20,
    Aarch64AddAbsLo12Nc = 21,
    Aarch64Ld64GotLo12Nc = 22,
    RiscvCallPlt = 23,
    RiscvTlsGdHi20 = 24,
    RiscvPCRelLo12I = 25,
    RiscvGotHi20 = 26,
    RiscvPCRelHi20 = 27,
    S390xTlsGd64 = 28,
    S390xTlsGdCall = 29,
    PulleyPcRel = 30,
    PulleyCallIndirectHost = 31,
});

codes!(LibCall, libcall_code, libcall_of_code, {
    Probestack = 0,
    CeilF32 = 1,
    CeilF64 = 2,
    FloorF32 = 3,
    FloorF64 = 4,
    TruncF32 = 5,
    TruncF64 = 6,
    NearestF32 = 7,
    NearestF64 = 8,
    FmaF32 = 9,
    FmaF64 = 10,
    Memcpy = 11,
    Memset = 12,
    Memmove = 13,
    Memcmp = 14,
    ElfTlsGetAddr = 15,
    ElfTlsGetOffset = 16,
    X86Pshufb = 17,
});

codes!(KnownSymbol, known_symbol_code, known_symbol_of_code, {
    ElfGlobalOffsetTable = 0,
    CoffTlsIndex = 1,
});

/// How many bytes from its offset a relocation of `kind` patches (at
/// least; a marker relocation patches none), as cranelift-jit and
/// cranelift-object write them: what must lie within the code.
fn patched_bytes(kind: Reloc) -> u32 {
    match kind {
        Reloc::Abs8 | Reloc::RiscvCallPlt | Reloc::S390xTlsGd64 => 8,
        Reloc::Abs4
        | Reloc::X86PCRel4
        | Reloc::X86CallPCRel4
        | Reloc::X86CallPLTRel4
        | Reloc::X86GOTPCRel4
        | Reloc::X86SecRel
        | Reloc::Arm32Call
        | Reloc::Arm64Call
        | Reloc::S390xPCRel32Dbl
        | Reloc::S390xPLTRel32Dbl
        | Reloc::ElfX86_64TlsGd
        | Reloc::MachOX86_64Tlv
        | Reloc::MachOAarch64TlsAdrPage21
        | Reloc::MachOAarch64TlsAdrPageOff12
        | Reloc::Aarch64TlsDescAdrPage21
        | Reloc::Aarch64TlsDescLd64Lo12
        | Reloc::Aarch64TlsDescAddLo12
        | Reloc::Aarch64TlsDescCall
        | Reloc::Aarch64AdrGotPage21
        | Reloc::Aarch64AdrPrelPgHi21
        | Reloc::Aarch64AddAbsLo12Nc
        | Reloc::Aarch64Ld64GotLo12Nc
        | Reloc::RiscvTlsGdHi20
        | Reloc::RiscvPCRelLo12I
        | Reloc::RiscvGotHi20
        | Reloc::RiscvPCRelHi20
        | Reloc::PulleyPcRel => 4,
        Reloc::PulleyCallIndirectHost => 1,
        Reloc::S390xTlsGdCall => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_codes_are_dense() {
        let relocs: Vec<Reloc> = (0..=u8::MAX).filter_map(reloc_of_code).collect();
        for (i, kind) in relocs.iter().enumerate() {
            assert_eq!(usize::from(reloc_code(*kind)), i);
        }
        assert_eq!(relocs.len(), 32);
        let libcalls: Vec<LibCall> = (0..=u8::MAX).filter_map(libcall_of_code).collect();
        for (i, libcall) in libcalls.iter().enumerate() {
            assert_eq!(usize::from(libcall_code(*libcall)), i);
        }
        // Every libcall Cranelift lists has a number.
        assert_eq!(libcalls.len(), LibCall::all_libcalls().len());
        for libcall in LibCall::all_libcalls() {
            assert_eq!(libcall_of_code(libcall_code(*libcall)), Some(*libcall));
        }
        let symbols: Vec<KnownSymbol> = (0..=u8::MAX).filter_map(known_symbol_of_code).collect();
        assert_eq!(
            symbols,
            [KnownSymbol::ElfGlobalOffsetTable, KnownSymbol::CoffTlsIndex]
        );
    }

    /// A small entry of every target kind, built by hand.
    fn small() -> Entry {
        Entry {
            template: Digests::of_template(&[3, 1, 4, 1, 5]),
            slots: 2,
            bytes: (0..32).collect(),
            alignment: 16,
            relocs: vec![
                EntryReloc {
                    offset: 0,
                    kind: Reloc::Abs8,
                    addend: -8,
                    target: EntryTarget::Slot(1),
                },
                EntryReloc {
                    offset: 8,
                    kind: Reloc::X86CallPCRel4,
                    addend: -4,
                    target: EntryTarget::LibCall(LibCall::Memcpy),
                },
                EntryReloc {
                    offset: 12,
                    kind: Reloc::X86PCRel4,
                    addend: 0,
                    target: EntryTarget::KnownSymbol(KnownSymbol::CoffTlsIndex),
                },
                EntryReloc {
                    offset: 28,
                    kind: Reloc::Abs4,
                    addend: 3,
                    target: EntryTarget::OwnOffset(32),
                },
            ],
            compile_time: Duration::from_nanos(123_456_789),
            unwind: EntryUnwind::Omitted,
            verified: None,
        }
    }

    fn context() -> CodeContext {
        CodeContext::from_text("unit".into())
    }

    /// Recomputes the checksum of a changed plain entry.
    fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
        bytes.truncate(bytes.len() - CHECKSUM_BYTES);
        let checksum = xxhash_rust::xxh3::xxh3_128(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8]) -> Result<Entry, EntryRejected> {
        Entry::decode_words(bytes, &context(), &[3, 1, 4, 1, 5], None)
    }

    /// Where the relocation records start in an encoding of [`small`].
    const RELOCS_AT: usize = 12 + 32 + 32 + 32 + 4 + 4 + 8 + 4 + 32 + 4;

    #[test]
    fn the_format_is_pinned() {
        let entry = small();
        let bytes = entry.encode(&context(), None);
        assert_eq!(decode(&bytes), Ok(entry.clone()));
        assert_eq!(
            u32::from_le_bytes(bytes[RELOCS_AT - 4..RELOCS_AT].try_into().unwrap()),
            4
        );
        // Any change of the layout, a number or the checksum shows here;
        // it must come with a new FORMAT_VERSION.
        assert_eq!(
            blake3::hash(&bytes).to_hex()[..16],
            *"bf0eba3718527292",
            "{bytes:02x?}"
        );
        let signed = entry.encode(&context(), Some(&Secret::new([1; 32])));
        assert_eq!(signed.len(), bytes.len() + MAC_BYTES);
        assert_eq!(
            signed[..bytes.len() - CHECKSUM_BYTES],
            bytes[..bytes.len() - CHECKSUM_BYTES][..]
                .iter()
                .enumerate()
                .map(|(i, b)| if i == 10 { b | 1 } else { *b })
                .collect::<Vec<_>>()[..]
        );
    }

    /// Each structural check, on an entry whose checksum is right.
    #[test]
    fn malformed_entries_with_a_good_checksum_are_rejected() {
        let good = small().encode(&context(), None);
        let patched = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            decode(&reseal(b))
        };
        // Record 0: offset 0..4, kind 4, target kind 5, addend 6..14,
        // target 14..18.
        let r = RELOCS_AT;
        assert_eq!(
            patched(r + 4, &[200]),
            Err(EntryRejected::BadRelocKind(200))
        );
        assert_eq!(patched(r + 5, &[9]), Err(EntryRejected::BadTargetKind(9)));
        assert_eq!(
            patched(r + 14, &2u32.to_le_bytes()),
            Err(EntryRejected::SlotOutOfRange { slot: 2, slots: 2 })
        );
        // Record 1 is a libcall, record 2 a known symbol.
        let r1 = r + RELOC_BYTES;
        let r2 = r1 + RELOC_BYTES;
        assert_eq!(
            patched(r1 + 14, &18u32.to_le_bytes()),
            Err(EntryRejected::BadLibCall(18))
        );
        assert_eq!(
            patched(r1 + 14, &256u32.to_le_bytes()),
            Err(EntryRejected::BadLibCall(256))
        );
        assert_eq!(
            patched(r2 + 14, &2u32.to_le_bytes()),
            Err(EntryRejected::BadKnownSymbol(2))
        );
        // An Abs8 at 25 patches 25..33, past the 32 code bytes.
        assert_eq!(
            patched(r, &25u32.to_le_bytes()),
            Err(EntryRejected::OutsideCode { offset: 25 })
        );
        assert!(patched(r, &24u32.to_le_bytes()).is_ok());
        // An own offset past the end.
        let r3 = r2 + RELOC_BYTES;
        assert_eq!(
            patched(r3 + 14, &33u32.to_le_bytes()),
            Err(EntryRejected::OutsideCode { offset: 28 })
        );
        // Alignment (after the digests and the slot count).
        let align_at = 12 + 32 + 32 + 32 + 4;
        assert_eq!(
            patched(align_at, &12u32.to_le_bytes()),
            Err(EntryRejected::BadAlignment(12))
        );
        assert_eq!(
            patched(align_at, &0u32.to_le_bytes()),
            Err(EntryRejected::BadAlignment(0))
        );
        // Unwind tag, the last byte before the checksum.
        let unwind_at = good.len() - CHECKSUM_BYTES - 1;
        assert_eq!(patched(unwind_at, &[3]), Err(EntryRejected::BadUnwind));
        // A length that runs past the end (the code's).
        assert_eq!(
            patched(align_at + 4 + 8, &1000u32.to_le_bytes()),
            Err(EntryRejected::Truncated)
        );
        // A byte left over inside the checksummed part.
        let mut longer = good.clone();
        longer.insert(good.len() - CHECKSUM_BYTES, 0);
        assert_eq!(decode(&reseal(longer)), Err(EntryRejected::TrailingBytes));
    }

    /// The template is checked by its digest: any other word, count or
    /// order is another template.
    #[test]
    fn the_template_is_checked_by_its_digest() {
        let good = small().encode(&context(), None);
        let decode_for =
            |words: &[u32]| Entry::decode_words(&good, &context(), words, None).map(|_| ());
        assert_eq!(decode_for(&[3, 1, 4, 1, 5]), Ok(()));
        for other in [
            &[3, 1, 4, 1, 6][..],
            &[3, 1, 4, 1],
            &[3, 1, 4, 1, 5, 0],
            &[1, 3, 4, 1, 5],
            &[],
        ] {
            assert_eq!(decode_for(other), Err(EntryRejected::OtherTemplate));
        }
        // A byte of the digest this machine checks changed (checksum made
        // right again) is another template; the other digest is not read.
        let (checked, unread) = if checks_by_sha256(20) {
            (12 + 32 + 32, 12 + 32)
        } else {
            (12 + 32, 12 + 32 + 32)
        };
        for (at, rejected) in [(checked, true), (unread, false)] {
            let mut changed = good.clone();
            changed[at + 7] ^= 1;
            let result = decode(&reseal(changed));
            assert_eq!(result.is_err(), rejected, "{result:?}");
            if rejected {
                assert_eq!(result, Err(EntryRejected::OtherTemplate));
            }
        }
        // Each digest decides alone, whichever this machine checks.
        let words = [3, 1, 4, 1, 5];
        let good_digests = Digests::of_template(&words);
        let s = good_digests.sha256;
        let mut bad_b = good_digests;
        bad_b.blake3[0] ^= 1;
        let mut bad_s = good_digests;
        bad_s.sha256[31] ^= 1;
        for by_sha256 in [false, true] {
            let matches = |digests: Digests, words: &[u32]| {
                digests.matches_by(
                    by_sha256,
                    || template_digest(words),
                    || template_sha256(words),
                )
            };
            assert!(matches(good_digests, &words));
            assert!(!matches(good_digests, &[3, 1, 4, 1, 6]));
            assert!(!matches(good_digests, &[3, 1, 4, 1]));
            assert_eq!(matches(bad_b, &words), by_sha256);
            assert_eq!(matches(bad_s, &words), !by_sha256);
        }
        // Only inputs under SHA256_BELOW bytes are ever checked by SHA-256,
        // so a writer leaves its digest of a longer one out (zeros).
        assert!(!checks_by_sha256(SHA256_BELOW));
        let long = vec![7u32; SHA256_BELOW / 4];
        let long_digests = Digests::of_template(&long);
        assert_eq!(long_digests.sha256, [0; 32]);
        assert!(long_digests.matches(
            SHA256_BELOW,
            || template_digest(&long),
            || panic!("SHA-256 is never read at this length")
        ));
        let shorter = &long[1..];
        assert_eq!(
            Digests::of_template(shorter).sha256,
            template_sha256(shorter)
        );
        assert_eq!(
            checks_by_sha256(SHA256_BELOW - 1),
            has_sha256_instructions()
        );
        // SHA-256's digest, as its definition says, computed apart.
        {
            use sha2::Digest;
            let mut block = [0u8; 64];
            block[..32].copy_from_slice(b"jitfold template digest, SHA-256");
            let mut bytes = block.to_vec();
            for w in words {
                bytes.extend_from_slice(&w.to_le_bytes());
            }
            bytes.extend_from_slice(&5u64.to_le_bytes());
            assert_eq!(s, <[u8; 32]>::from(sha2::Sha256::digest(&bytes)));
        }
        // The digest is of the words, pinned (a change needs a new format
        // version).
        assert_eq!(
            blake3::Hash::from_bytes(template_digest(&[3, 1, 4, 1, 5])).to_hex()[..16],
            *"2a16d2ed7abcd3a3"
        );
        // Long keys are hashed in pieces: the same as one piece would be.
        let long: Vec<u32> = (0..1000).collect();
        let mut hasher = blake3::Hasher::new_derive_key("jitfold template digest");
        for w in &long {
            hasher.update(&w.to_le_bytes());
        }
        hasher.update(&1000u64.to_le_bytes());
        assert_eq!(template_digest(&long), *hasher.finalize().as_bytes());
    }

    /// Around [`SHA256_BELOW`]: the entry of a template one word short of
    /// it (SHA-256 written; checked by it where this CPU can) and of one
    /// at it (SHA-256 left out; checked by BLAKE3 everywhere) decode for
    /// their own words and not for a neighbour's.
    #[test]
    fn templates_around_the_threshold_decode_for_their_own_words_only() {
        assert_eq!(
            SHA256_BELOW, 6144,
            "part of the format: a change needs a new FORMAT_VERSION"
        );
        for len in [SHA256_BELOW / 4 - 1, SHA256_BELOW / 4] {
            let words: Vec<u32> = (0..len as u32).collect();
            let entry = Entry {
                template: Digests::of_template(&words),
                ..small()
            };
            assert_eq!(entry.template_sha256() == &[0; 32], len * 4 >= SHA256_BELOW);
            let bytes = entry.encode(&context(), None);
            assert_eq!(
                Entry::decode_words(&bytes, &context(), &words, None),
                Ok(entry.clone()),
                "{len} words"
            );
            let mut other = words.clone();
            other[len / 2] ^= 1;
            assert_eq!(
                Entry::decode_words(&bytes, &context(), &other, None),
                Err(EntryRejected::OtherTemplate),
                "{len} words"
            );
        }
    }

    /// A verified function's digests are carried under the checksum,
    /// after the unwind information, and flagged; an entry without them
    /// encodes as before (the pinned bytes above).
    #[test]
    fn a_verified_digest_round_trips_under_the_checksum() {
        let plain = small().encode(&context(), None);
        let digests = Digests {
            blake3: [7; 32],
            sha256: [9; 32],
        };
        let entry = small().with_verified(digests);
        assert_eq!(entry.verified(), Some(&digests));
        assert_eq!(small().verified(), None);
        let bytes = entry.encode(&context(), None);
        assert_eq!(bytes.len(), plain.len() + 64);
        assert_eq!(bytes[10], FLAG_VERIFIED as u8);
        let at = bytes.len() - CHECKSUM_BYTES - 64;
        assert_eq!(bytes[at..][..32], [7; 32]);
        assert_eq!(bytes[at + 32..][..32], [9; 32]);
        assert_eq!(decode(&bytes), Ok(entry.clone()));
        // Signed: both flags, and the MAC covers the digest.
        let secret = Secret::new([1; 32]);
        let signed = entry.encode(&context(), Some(&secret));
        assert_eq!(signed[10], (FLAG_MAC | FLAG_VERIFIED) as u8);
        let decoded = Entry::decode_words(&signed, &context(), &[3, 1, 4, 1, 5], Some(&secret));
        assert_eq!(decoded.as_ref().map(Entry::verified), Ok(Some(&digests)));
        let mut forged = signed.clone();
        let at = forged.len() - MAC_BYTES - CHECKSUM_BYTES - 1;
        forged[at] ^= 1;
        let forged = {
            // The checksum made right again; the MAC cannot be.
            let body = forged.len() - MAC_BYTES - CHECKSUM_BYTES;
            let sum = xxhash_rust::xxh3::xxh3_128(&forged[..body]);
            forged[body..body + CHECKSUM_BYTES].copy_from_slice(&sum.to_le_bytes());
            forged
        };
        assert_eq!(
            Entry::decode_words(&forged, &context(), &[3, 1, 4, 1, 5], Some(&secret)),
            Err(EntryRejected::MacInvalid)
        );
        // The flag without the digest is a truncated entry; the digest
        // without the flag is bytes left over.
        let mut flag_only = plain.clone();
        flag_only[10] |= FLAG_VERIFIED as u8;
        assert_eq!(decode(&reseal(flag_only)), Err(EntryRejected::Truncated));
        let mut digest_only = bytes.clone();
        digest_only[10] &= !(FLAG_VERIFIED as u8);
        assert_eq!(
            decode(&reseal(digest_only)),
            Err(EntryRejected::TrailingBytes)
        );
        // Any other flag is still unknown.
        let mut unknown = plain;
        unknown[10] |= 4;
        assert_eq!(
            decode(&reseal(unknown)),
            Err(EntryRejected::UnknownFlags(4))
        );
    }

    #[test]
    fn entries_breaking_the_invariants_are_not_made() {
        // `check_code` is what `new` relies on; the same checks as decode.
        let mut entry = small();
        assert_eq!(entry.check_code(), Ok(()));
        entry.alignment = 3;
        assert_eq!(entry.check_code(), Err(EntryRejected::BadAlignment(3)));
    }
}
