//! The exact-duplicate cache: fingerprints in, equivalence classes out.
//!
//! # What this module guarantees
//!
//! - Two fingerprints get the same [`ClassId`] if and only if their keys are
//!   equal (the table compares whole keys after the hash matches; the hash is
//!   only a filter), or the caller said they are equal with
//!   [`DedupCache::insert_alias`].
//! - Class ids are dense and handed out in insertion order, starting at 0.
//! - The cache stores fingerprints, never functions: memory per entry is the
//!   key plus a few words, and nothing keeps an `ir::Function` alive.
//! - The hash table is keyed per process (see [`crate::fingerprint`]), so
//!   adversarial inputs cannot make lookups quadratic.

use crate::fingerprint::{BorrowedFingerprint, CanonicalKey, Fingerprint, Probe};
use cranelift_codegen::entity::{PrimaryMap, entity_impl};
use hashbrown::HashMap;

/// An equivalence class of functions with equal fingerprints.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(u32);
entity_impl!(ClassId, "class");

/// What [`DedupCache::insert`] found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The fingerprint was not in the cache; it now starts this class.
    New(ClassId),
    /// The fingerprint was already in the cache, in this class.
    Duplicate(ClassId),
}

impl Lookup {
    /// The class, whether new or existing.
    pub fn class(self) -> ClassId {
        match self {
            Lookup::New(c) | Lookup::Duplicate(c) => c,
        }
    }

    /// True for [`Lookup::Duplicate`].
    pub fn is_duplicate(self) -> bool {
        matches!(self, Lookup::Duplicate(_))
    }
}

/// A map from keys of one kind (exact fingerprints by default, or
/// templates, or fingerprints with the calling convention erased) to
/// classes, with hit and miss counts.
pub struct DedupCache<K = Fingerprint> {
    classes: HashMap<K, ClassId>,
    members: PrimaryMap<ClassId, u32>,
    hits: u64,
    misses: u64,
}

impl<K> Default for DedupCache<K> {
    fn default() -> Self {
        Self {
            classes: HashMap::new(),
            members: PrimaryMap::new(),
            hits: 0,
            misses: 0,
        }
    }
}

impl DedupCache<Fingerprint> {
    /// [`DedupCache::get`] of a fingerprint whose key is borrowed.
    pub fn get_borrowed(&self, fp: &BorrowedFingerprint<'_>) -> Option<ClassId> {
        self.get_probe(&fp.probe())
    }
}

impl<K: CanonicalKey> DedupCache<K> {
    /// [`DedupCache::get`] of the key `probe` stands for, whose words are
    /// borrowed: nothing is copied.
    pub fn get_probe<'p>(&self, probe: &Probe<'p, K>) -> Option<ClassId>
    where
        Probe<'p, K>: hashbrown::Equivalent<K>,
    {
        self.classes.get(probe).copied()
    }
}

impl<K: CanonicalKey> DedupCache<K> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks `fp` up and inserts it if absent. Counts a hit or a miss.
    pub fn insert(&mut self, fp: K) -> Lookup {
        let found = self.get_or_insert(fp);
        if let Lookup::Duplicate(class) = found {
            self.count_hit(class);
        }
        found
    }

    /// Like [`DedupCache::insert`], but a fingerprint already present is
    /// not counted as a hit (for a caller that counts its outcomes
    /// elsewhere).
    pub fn get_or_insert(&mut self, fp: K) -> Lookup {
        match self.classes.entry(fp) {
            hashbrown::hash_map::Entry::Occupied(e) => Lookup::Duplicate(*e.get()),
            hashbrown::hash_map::Entry::Vacant(e) => {
                self.misses += 1;
                let class = self.members.push(1);
                e.insert(class);
                Lookup::New(class)
            }
        }
    }

    /// Counts a hit on `class`: one more member.
    fn count_hit(&mut self, class: ClassId) -> ClassId {
        self.hits += 1;
        self.members[class] += 1;
        class
    }

    /// Makes `fp` a second key of `class` (a fingerprint known to belong to
    /// a function equal to the class's). Returns false, changing nothing,
    /// if `fp` is already in the cache or `class` does not exist.
    pub fn insert_alias(&mut self, fp: K, class: ClassId) -> bool {
        if !self.members.is_valid(class) {
            return false;
        }
        match self.classes.entry(fp) {
            hashbrown::hash_map::Entry::Occupied(_) => false,
            hashbrown::hash_map::Entry::Vacant(e) => {
                e.insert(class);
                true
            }
        }
    }

    /// The class of `fp`, if present. Does not count as a hit or a miss
    /// (a lookup writes nothing).
    pub fn get(&self, fp: &K) -> Option<ClassId> {
        self.classes.get(fp).copied()
    }

    /// Number of classes (distinct keys) in the cache.
    pub fn classes(&self) -> usize {
        self.members.len()
    }

    /// Number of fingerprints inserted into `class` so far.
    pub fn members(&self, class: ClassId) -> u32 {
        self.members.get(class).copied().unwrap_or(0)
    }

    /// Number of [`DedupCache::insert`] calls that found a duplicate.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Number of [`DedupCache::insert`] calls that started a new class.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Every fingerprint in the cache with its class, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, ClassId)> {
        self.classes.iter().map(|(fp, &class)| (fp, class))
    }

    /// Approximate heap bytes held: keys plus table overhead (words a key
    /// shares with keys elsewhere, a template's with its fingerprint's,
    /// are counted here too).
    pub fn heap_bytes(&self) -> usize {
        let keys: usize = self.classes.keys().map(|fp| fp.key().len() * 4).sum();
        let table = self.classes.capacity()
            * (core::mem::size_of::<K>() + core::mem::size_of::<ClassId>() + 1);
        keys + table + self.members.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One function per `(calling convention, k)`, returning its argument
    /// plus `k`; the `i`th numbers its parameter `vi` (so twins are
    /// renumbered).
    fn adders(functions: &[(&str, i32)]) -> Vec<cranelift_codegen::ir::Function> {
        let clif: String = functions
            .iter()
            .enumerate()
            .map(|(i, (conv, k))| {
                format!(
                    "function %f{i}(i32) -> i32 {conv} {{
                     block0(v{i}: i32):
                         v100 = iconst.i32 {k}
                         v101 = iadd v{i}, v100
                         return v101
                     }}\n"
                )
            })
            .collect();
        cranelift_reader::parse_functions(&clif).unwrap()
    }

    #[test]
    fn lookups_and_inserts_count_hits_and_misses_as_documented() {
        // Two renumbered twins, then another constant.
        let funcs = adders(&[("system_v", 1), ("system_v", 1), ("system_v", 2)]);
        let fps: Vec<Fingerprint> = funcs.iter().map(Fingerprint::of).collect();
        let (a, b, c) = (&fps[0], &fps[1], &fps[2]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut cache = DedupCache::new();
        // A lookup is not counted; the insert after it is.
        assert_eq!(cache.get(a), None);
        let first = cache.get_or_insert(a.clone());
        assert_eq!(first, Lookup::New(ClassId::from_u32(0)));
        assert_eq!((cache.hits(), cache.misses()), (0, 1));
        // A lookup counts nothing, nor does `get_or_insert` of a
        // fingerprint present.
        assert_eq!(cache.get(b), Some(first.class()));
        assert_eq!(
            cache.get_or_insert(b.clone()),
            Lookup::Duplicate(first.class())
        );
        assert_eq!((cache.hits(), cache.misses()), (0, 1));
        assert_eq!(cache.members(first.class()), 1);
        // `insert` counts both ways.
        assert_eq!(cache.insert(b.clone()), Lookup::Duplicate(first.class()));
        assert_eq!(cache.insert(c.clone()), Lookup::New(ClassId::from_u32(1)));
        assert_eq!((cache.hits(), cache.misses()), (1, 2));
        assert_eq!(cache.classes(), 2);
        assert_eq!(cache.get(c), Some(ClassId::from_u32(1)));
    }

    #[test]
    fn borrowed_fingerprints_find_what_owned_ones_do() {
        let funcs = adders(&[("system_v", 1), ("tail", 1)]);
        let mut walk = crate::Fingerprinter::new();
        let mut cache = DedupCache::new();
        let a = walk.fingerprint(&funcs[0]);
        let class = cache.insert(a.clone()).class();
        // The same function again, borrowed: found.
        let borrowed = walk.walk(&funcs[0]).key();
        assert_eq!(borrowed.key(), a.key());
        assert_eq!(borrowed.fast_hash(), a.fast_hash());
        assert_eq!(borrowed.to_fingerprint(), a);
        assert_eq!(cache.get_borrowed(&borrowed), Some(class));
        assert_eq!(cache.get_borrowed(&a.borrowed()), Some(class));
        assert_eq!(cache.hits(), 0);
        // Another calling convention: not found; nor is `a` with its
        // convention erased, which shares `a`'s words.
        let b = walk.walk(&funcs[1]).key();
        assert_eq!(cache.get_borrowed(&b), None);
        let b = b.to_fingerprint();
        assert_ne!(b, a);
        let mut erased = DedupCache::new();
        erased.insert(a.erase_call_conv());
        assert_eq!(erased.get(&b.erase_call_conv()), Some(ClassId::from_u32(0)));
        assert_eq!(cache.hits(), 0);
    }
}
