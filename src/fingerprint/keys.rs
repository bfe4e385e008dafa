//! The kinds of key a walk yields, each its own type, and their
//! hashes.
//!
//! # What this module guarantees
//!
//! - [`Fingerprint`] (the exact key), [`Template`] (the exact key without
//!   the names behind its name slots), [`ErasedConvention`] (the exact
//!   key without its first word, the calling convention) and [`Shape`]
//!   (the exact key with parameterizable constants masked) are distinct
//!   types: a key of one kind is never compared with, hashed into a table
//!   of, or given names as, a key of another kind.
//! - Within a kind, `Eq`, `Hash` and `Ord` agree: equal keys have equal
//!   hashes, and `Ord` is the lexicographic order of the key words.
//! - The first three share one allocation of key words: taking a template or
//!   erasing the convention copies no word and hashes no word twice.

use super::{KEY_FORMAT_VERSION, SymbolName, walk};
use core::cmp::Ordering;
use core::hash::{BuildHasher, Hash, Hasher};
use cranelift_codegen::ir::Function;
use std::sync::{Arc, OnceLock};

/// The words of an exact key, and which part of them a key of some kind
/// is. Private: each kind wraps it in its own type.
#[derive(Clone)]
struct Key {
    /// The exact key of the function; a template's key is a prefix of it.
    words: Arc<[u32]>,
    /// Where this key starts in `words`: 0, or 1 when the calling
    /// convention is erased (it is the first word).
    start: u32,
    /// Where this key ends in `words`.
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

impl Key {
    fn of_exact(
        words: Arc<[u32]>,
        instructions: u32,
        template_len: u32,
        hashes: KeyHashes,
    ) -> Self {
        Self {
            len: words.len() as u32,
            words,
            start: 0,
            template_len,
            hash: hashes.hash,
            template_hash: hashes.template_hash,
            body_hash: hashes.body_hash,
            instructions,
        }
    }

    fn words(&self) -> &[u32] {
        &self.words[self.start as usize..self.len as usize]
    }

    /// The template part of this key (itself if it is a template).
    fn template(&self) -> Self {
        Self {
            len: self.template_len,
            hash: self.template_hash,
            ..self.clone()
        }
    }

    /// This key without the calling convention.
    fn erased(&self) -> Self {
        // The key starts with the signature, whose first word is the
        // calling convention (see `walk::encode_signature`): the erased
        // key is the rest, sharing the words, and its hash continues from
        // the hash of that rest's template part.
        let names = &self.words[self.template_len as usize..self.len as usize];
        let (template_hash, hash) = key_hashes(None, self.body_hash, names);
        Self {
            start: 1,
            hash,
            template_hash,
            ..self.clone()
        }
    }

    fn stable_hash(&self) -> u64 {
        let mut bytes = Vec::with_capacity(self.words().len() * 4);
        for word in self.words() {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, u64::from(KEY_FORMAT_VERSION))
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.start == other.start && self.words() == other.words()
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        write_fast_hash(self.hash, state);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        // `start` orders erased keys after the others, so that `Ord` agrees
        // with `Eq` in a `Fingerprint` that holds an erased key (possible
        // only through `Fingerprint::with_call_conv_erased`).
        (self.start, self.words()).cmp(&(other.start, other.words()))
    }
}

/// What the kinds of key offer, so that one table can hold keys of
/// any one kind. Sealed: the types of this module are the only kinds.
pub trait CanonicalKey: Clone + Eq + Hash + Ord + core::fmt::Debug + sealed::Sealed {
    /// The key words. Equal words mean interchangeable functions (for the
    /// kind's notion of interchangeable).
    fn key(&self) -> &[u32];
    /// The in-memory hash: keyed with a per-process random seed.
    fn fast_hash(&self) -> u64;
}

mod sealed {
    /// Implemented by the kinds of key of this module only.
    pub trait Sealed {}
    impl Sealed for super::Fingerprint {}
    impl Sealed for super::Template {}
    impl Sealed for super::ErasedConvention {}
    impl Sealed for super::Shape {}
}

/// Declares a kind of key: the newtype over [`Key`], its `Eq`, `Hash`, `Ord`
/// and `Debug`, its accessors, and [`CanonicalKey`].
macro_rules! key_kind {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Key);

        impl $name {
            /// The canonical key words.
            pub fn key(&self) -> &[u32] {
                self.0.words()
            }

            /// Number of instructions the walk encoded (reachable, in the
            /// layout).
            pub fn instructions(&self) -> u32 {
                self.0.instructions
            }

            /// The in-memory hash: keyed with a per-process random seed,
            /// so it is different in every process. Use `stable_hash` for
            /// anything that is stored or compared across processes.
            pub fn fast_hash(&self) -> u64 {
                self.0.hash
            }

            /// A 64-bit hash of the key that is the same in every process
            /// and on every machine for a given version of jitfold and
            /// Cranelift (XXH3 over the little-endian bytes of the key,
            /// seeded with [`KEY_FORMAT_VERSION`]). The one exception is
            /// the key of a function whose constant pool maps bytes to
            /// handles otherwise than setting its handles in order would
            /// (`ConstantPool::entries_mut` can leave it so): it holds a
            /// number unique within its process, drawn anew each walk.
            pub fn stable_hash(&self) -> u64 {
                self.0.stable_hash()
            }
        }

        impl CanonicalKey for $name {
            fn key(&self) -> &[u32] {
                self.key()
            }

            fn fast_hash(&self) -> u64 {
                self.fast_hash()
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(
                    f,
                    concat!(stringify!($name), "({:016x}, {} words)"),
                    self.stable_hash(),
                    self.key().len()
                )
            }
        }
    };
}

key_kind! {
    /// The canonical fingerprint of one function: its exact key and a keyed
    /// hash of it. Equal fingerprints mean one function can be compiled in
    /// place of the other (see the [module docs](super)).
    ///
    /// Holds no reference to the function it came from; memory use is the
    /// key (a few words per instruction) plus six words. Cloning it, taking
    /// its [template](Fingerprint::to_template) and erasing its calling
    /// convention share the key instead of copying it.
    Fingerprint
}

key_kind! {
    /// The key of a function without the names behind its name slots (see
    /// the [module docs](super)): functions with equal templates compile to
    /// the same machine code up to the targets of relocations against those
    /// names. [`Template::with_names`] gives the names back.
    Template
}

key_kind! {
    /// The exact key of a function with the calling convention of its own
    /// signature erased: equal for two functions exactly when they are the
    /// same function except, possibly, for that calling convention (the
    /// parameter and return types, extensions and purposes still count).
    ErasedConvention
}

key_kind! {
    /// The exact key of a function with the immediates of its
    /// parameterizable constants masked, followed by the positions masked
    /// (see [`crate::similar`]): equal for two functions exactly when they
    /// are the same function except, possibly, for the values of those
    /// constants, which one body can then take as parameters. Never equal
    /// to a key of another kind, and not a cache key of compiled code.
    Shape
}

impl Shape {
    /// The shape whose key is `words` (built by [`crate::similar`]).
    pub(crate) fn of_words(words: Vec<u32>, instructions: u32) -> Self {
        let len = words.len() as u32;
        let hashes = KeyHashes::of(&words, len);
        Shape(Key::of_exact(words.into(), instructions, len, hashes))
    }
}

impl Fingerprint {
    /// Fingerprints `func` with a fresh [`Fingerprinter`](super::Fingerprinter).
    /// To fingerprint many functions, keep one `Fingerprinter` and reuse its
    /// scratch memory.
    pub fn of(func: &Function) -> Self {
        super::Fingerprinter::new().fingerprint(func)
    }

    /// This fingerprint as a [`BorrowedFingerprint`], which looks it up
    /// the same way.
    pub fn borrowed(&self) -> BorrowedFingerprint<'_> {
        // An exact key starts at the first word (only `ErasedConvention`
        // holds a key that does not).
        let words = &self.0.words[..self.0.len as usize];
        BorrowedFingerprint {
            shared: (words.len() == self.0.words.len()).then_some(&self.0.words),
            ..BorrowedFingerprint::new(
                words,
                self.0.instructions,
                self.0.template_len,
                KeyHashes {
                    hash: self.0.hash,
                    template_hash: self.0.template_hash,
                    body_hash: self.0.body_hash,
                },
            )
        }
    }

    /// This function's [`Template`]. Shares the key words.
    pub fn to_template(&self) -> Template {
        Template(self.0.template())
    }

    /// This fingerprint with the calling convention of the function's own
    /// signature erased. Shares the key words.
    pub fn erase_call_conv(&self) -> ErasedConvention {
        ErasedConvention(self.0.erased())
    }
}

impl Template {
    /// The exact fingerprint of the function this template was taken from,
    /// with its names replaced slot for slot by `names` (the same as
    /// fingerprinting that function after renaming those external names, as
    /// long as `names` are distinct).
    pub fn with_names(&self, names: &[SymbolName]) -> Fingerprint {
        // A template is never erased, so its key starts at the first word.
        let mut words = self.key().to_vec();
        walk::encode_names(&mut words, names);
        let hashes = KeyHashes::of(&words, self.0.template_len);
        Fingerprint(Key::of_exact(
            words.into(),
            self.0.instructions,
            self.0.template_len,
            hashes,
        ))
    }
}

/// The in-memory hashes of a key (see [`key_hashes`]).
#[derive(Clone, Copy, Default)]
pub(super) struct KeyHashes {
    hash: u64,
    template_hash: u64,
    /// Of the template part after the calling convention.
    body_hash: u64,
}

impl KeyHashes {
    /// The hashes of the exact key `words` whose template part is
    /// `words[..template_len]`.
    pub(super) fn of(words: &[u32], template_len: u32) -> Self {
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

/// A [`Fingerprint`] whose key stays in the
/// [`Fingerprinter`](super::Fingerprinter) that computed it
/// ([`Walk::key`](super::Walk::key)): the same key and hashes, without the
/// copy. [`DedupCache::get_borrowed`](crate::DedupCache::get_borrowed)
/// takes it, so a cache hit allocates nothing. Borrowed from a
/// [`Fingerprint`] ([`Fingerprint::borrowed`]), its copies
/// ([`BorrowedFingerprint::to_fingerprint`],
/// [`BorrowedFingerprint::to_template`]) share that fingerprint's key
/// instead of copying it.
#[derive(Clone, Copy)]
pub struct BorrowedFingerprint<'a> {
    words: &'a [u32],
    /// The allocation `words` is all of, when borrowed from a
    /// [`Fingerprint`].
    shared: Option<&'a Arc<[u32]>>,
    instructions: u32,
    template_len: u32,
    hashes: KeyHashes,
}

impl<'a> BorrowedFingerprint<'a> {
    pub(super) fn new(
        words: &'a [u32],
        instructions: u32,
        template_len: u32,
        hashes: KeyHashes,
    ) -> Self {
        Self {
            words,
            shared: None,
            instructions,
            template_len,
            hashes,
        }
    }

    /// The first `len` words of this key, in an allocation of their own:
    /// `shared` (all of the key) if borrowed from a [`Fingerprint`], else
    /// a copy of those words.
    fn owned_words(&self, len: usize) -> Arc<[u32]> {
        match self.shared {
            Some(words) => words.clone(),
            None => self.words[..len].into(),
        }
    }

    /// The canonical key, as [`Fingerprint::key`].
    pub fn key(&self) -> &'a [u32] {
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

    /// The template's key words, borrowed: the start of
    /// [`BorrowedFingerprint::key`] (the names follow them), equal to
    /// [`BorrowedFingerprint::to_template`]'s [`Template::key`].
    pub fn template_key(&self) -> &'a [u32] {
        &self.words[..self.template_len as usize]
    }

    /// The owned fingerprint: equal to what
    /// [`Fingerprinter::fingerprint`](super::Fingerprinter::fingerprint)
    /// returns for the same function.
    pub fn to_fingerprint(&self) -> Fingerprint {
        Fingerprint(Key::of_exact(
            self.owned_words(self.words.len()),
            self.instructions,
            self.template_len,
            self.hashes,
        ))
    }

    /// The template, as [`Fingerprint::to_template`] of
    /// [`BorrowedFingerprint::to_fingerprint`], copying only the template's
    /// words (none when borrowed from a [`Fingerprint`]).
    pub fn to_template(&self) -> Template {
        let words = self.owned_words(self.template_len as usize);
        Template(Key {
            len: self.template_len,
            hash: self.hashes.template_hash,
            ..Key::of_exact(words, self.instructions, self.template_len, self.hashes)
        })
    }
}

impl<'a> BorrowedFingerprint<'a> {
    /// This fingerprint, as a [`Probe`] of tables of [`Fingerprint`]s.
    pub fn probe(&self) -> Probe<'a, Fingerprint> {
        Probe::new(self.words, 0, self.hashes.hash)
    }

    /// Its template, as a [`Probe`] of tables of [`Template`]s: found
    /// where [`BorrowedFingerprint::to_template`] is, copying nothing.
    pub fn template_probe(&self) -> Probe<'a, Template> {
        Probe::new(self.template_key(), 0, self.hashes.template_hash)
    }

    /// This fingerprint with its calling convention erased, as a
    /// [`Probe`] of tables of [`ErasedConvention`]s: found where
    /// [`Fingerprint::erase_call_conv`] of
    /// [`BorrowedFingerprint::to_fingerprint`] is, copying nothing.
    pub fn erased_probe(&self) -> Probe<'a, ErasedConvention> {
        // As `Key::erased`: the words after the calling convention, and
        // the hash of the names continued from the body's.
        let names = &self.words[self.template_len as usize..];
        let (_, hash) = key_hashes(None, self.hashes.body_hash, names);
        Probe::new(self.words.get(1..).unwrap_or_default(), 1, hash)
    }
}

/// A key of kind `K` whose words stay where a walk left them: a table of
/// `K` finds it where it finds the owned key with the same words (its
/// `Hash` is the owned key's, and it is equivalent to exactly the keys
/// equal to that one), and probes of one kind compare as their owned keys
/// do. Made by [`BorrowedFingerprint::probe`],
/// [`BorrowedFingerprint::template_probe`] and
/// [`BorrowedFingerprint::erased_probe`].
pub struct Probe<'a, K> {
    /// The key's words (from `start` on, in the owned key's words).
    words: &'a [u32],
    start: u32,
    hash: u64,
    kind: core::marker::PhantomData<fn() -> K>,
}

impl<'a, K> Probe<'a, K> {
    fn new(words: &'a [u32], start: u32, hash: u64) -> Self {
        Self {
            words,
            start,
            hash,
            kind: core::marker::PhantomData,
        }
    }
}

impl<K> Clone for Probe<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Probe<'_, K> {}

impl<K> PartialEq for Probe<'_, K> {
    fn eq(&self, other: &Self) -> bool {
        // As `Key`'s equality.
        self.hash == other.hash && self.start == other.start && self.words == other.words
    }
}

impl<K> Eq for Probe<'_, K> {}

impl<K> Hash for Probe<'_, K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        write_fast_hash(self.hash, state);
    }
}

/// A probe of a kind is equivalent to a key of that kind alone.
macro_rules! probe_of {
    ($($name:ident),*) => {$(
        impl hashbrown::Equivalent<$name> for Probe<'_, $name> {
            fn equivalent(&self, key: &$name) -> bool {
                // As `Key`'s equality.
                key.0.hash == self.hash && key.0.start == self.start && key.0.words() == self.words
            }
        }
    )*};
}

probe_of!(Fingerprint, Template, ErasedConvention);

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
pub(super) fn process_hasher() -> &'static hashbrown::DefaultHashBuilder {
    static HASHER: OnceLock<hashbrown::DefaultHashBuilder> = OnceLock::new();
    HASHER.get_or_init(hashbrown::DefaultHashBuilder::default)
}

/// What `Hash` feeds a hasher for a key whose fast hash is `fast_hash`; a
/// borrowed key looked up in a table of fingerprints must hash the same way.
fn write_fast_hash<H: Hasher>(fast_hash: u64, state: &mut H) {
    state.write_u64(fast_hash);
}

#[cfg(test)]
mod tests {
    use super::{ErasedConvention, Fingerprint, Template};
    use core::hash::BuildHasher;
    use hashbrown::{Equivalent, HashSet};

    /// Functions whose keys are equal in some kinds and not in others:
    /// the same body calling another name (one template), in another
    /// calling convention (one key with the convention erased), and
    /// another body.
    fn fingerprints() -> Vec<Fingerprint> {
        let text = |conv: &str, callee: u32, k: i64| {
            format!(
                "function %f(i64) -> i64 {conv} {{
                     sig0 = (i64) -> i64 system_v
                     fn0 = u0:{callee} sig0
                 block0(v0: i64):
                     v1 = iconst.i64 {k}
                     v2 = iadd v0, v1
                     v3 = call fn0(v2)
                     return v3
                 }}"
            )
        };
        [
            text("system_v", 1, 7),
            text("system_v", 2, 7),
            text("fast", 1, 7),
            text("fast", 2, 7),
            text("system_v", 1, 8),
            text("system_v", 1, 7),
        ]
        .iter()
        .map(|text| Fingerprint::of(&cranelift_reader::parse_functions(text).unwrap()[0]))
        .collect()
    }

    /// Copies out of a key borrowed from a [`Fingerprint`] share its words;
    /// copies out of a walk's own key copy them; both are the same keys.
    #[test]
    fn copies_of_a_borrowed_fingerprint_share_its_words() {
        use std::sync::Arc;
        let func = &cranelift_reader::parse_functions(
            "function %f(i64) -> i64 {
                 fn0 = u0:1 (i64) -> i64
             block0(v0: i64):
                 v1 = call fn0(v0)
                 return v1
             }",
        )
        .unwrap()[0];
        let mut walker = crate::Fingerprinter::new();
        let walked = walker.walk(func).key();
        let owned = walked.to_fingerprint();
        let borrowed = owned.borrowed();
        for (copied, shares) in [(walked, false), (borrowed, true)] {
            let (fingerprint, template) = (copied.to_fingerprint(), copied.to_template());
            assert_eq!(fingerprint, owned);
            assert_eq!(template, owned.to_template());
            assert_eq!(Arc::ptr_eq(&fingerprint.0.words, &owned.0.words), shares);
            assert_eq!(Arc::ptr_eq(&template.0.words, &owned.0.words), shares);
        }
    }

    /// A probe of each kind is found, hashed and compared exactly as the
    /// owned key of that kind it stands for.
    #[test]
    fn a_probe_is_its_owned_key_without_the_copy() {
        let fps = fingerprints();
        let hasher = hashbrown::DefaultHashBuilder::default();
        let mut alike = [0; 3];
        for a in &fps {
            let borrowed = a.borrowed();
            let (exact, template, erased) = (
                borrowed.probe(),
                borrowed.template_probe(),
                borrowed.erased_probe(),
            );
            let owned_template: Template = borrowed.to_template();
            let owned_erased: ErasedConvention = borrowed.to_fingerprint().erase_call_conv();
            assert_eq!(hasher.hash_one(exact), hasher.hash_one(a));
            assert_eq!(hasher.hash_one(template), hasher.hash_one(&owned_template));
            assert_eq!(hasher.hash_one(erased), hasher.hash_one(&owned_erased));
            for b in &fps {
                let other = b.borrowed();
                let (b_template, b_erased) = (b.to_template(), b.erase_call_conv());
                assert_eq!(exact.equivalent(b), a == b);
                assert_eq!(exact == other.probe(), a == b);
                assert_eq!(
                    template.equivalent(&b_template),
                    owned_template == b_template
                );
                assert_eq!(
                    template == other.template_probe(),
                    owned_template == b_template
                );
                assert_eq!(erased.equivalent(&b_erased), owned_erased == b_erased);
                assert_eq!(erased == other.erased_probe(), owned_erased == b_erased);
                alike[0] += usize::from(a == b);
                alike[1] += usize::from(owned_template == b_template);
                alike[2] += usize::from(owned_erased == b_erased);
            }
        }
        // Pairs alike (ordered, each with itself too): the first and the
        // last are one function (8 exact); the template leaves the
        // callee out ({0, 1, 5}, {2, 3}, {4}: 14); erasing the convention
        // leaves it in ({0, 2, 5}, {1, 3}, {4}: 14).
        assert_eq!(alike, [8, 14, 14]);
        // A table of owned keys finds each probe where it finds the key.
        let templates: HashSet<Template> = fps.iter().map(Fingerprint::to_template).collect();
        let found = fps
            .iter()
            .filter(|a| templates.contains(&a.borrowed().template_probe()))
            .count();
        assert_eq!((templates.len(), found), (3, fps.len()));
    }
}
