//! What a stored entry is looked up by: the [`CodeContext`] (everything
//! besides the function that changes its code) and the [`StoreKey`] (a
//! stable hash of the context and a template key).
//!
//! # What this module guarantees
//!
//! - Two ISAs give equal contexts exactly when they have the same target
//!   triple, the same value of every shared and ISA-specific setting, and
//!   come from the same version of jitfold, built against the same
//!   Cranelift and key format version. (The crate's version as well as
//!   the key format's: a release that fixes what the key misses, without
//!   bumping the format by hand, must not load what an older one stored
//!   under a key that merged two functions.)
//! - [`StoreKey::of`] depends only on the entry format version, the
//!   context and the template's key words: it is the same in every process
//!   and on every machine (XXH3 with a fixed seed, no per-process state).
//!   Distinct templates may collide (see [`StoreKey`]); entries are checked
//!   against the template's digest, so a collision is a miss.

use super::entry::FORMAT_VERSION;
use crate::fingerprint::{CRANELIFT_VERSION, KEY_FORMAT_VERSION, Template};
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::settings::Value;
use std::fmt;

/// Everything besides a function's template that changes its compiled
/// code: the target triple, the shared and ISA-specific settings, the
/// version of Cranelift, and jitfold's version and key format version (a
/// template key means something else in another format).
///
/// Held as a canonical text (one `name=value` line per setting, sorted by
/// name, the form Cranelift's `settings::Value` displays) and its BLAKE3
/// digest, which is what entries and keys carry. Every setting counts,
/// including ones that do not change code (such as `enable_verifier`): a
/// store is shared only between identically configured compilers.
#[derive(Clone, PartialEq, Eq)]
pub struct CodeContext {
    text: String,
    digest: [u8; 32],
}

impl CodeContext {
    /// The context of code compiled by `isa`. Formats every setting:
    /// compute it once per ISA (a module's lifetime), not per function.
    pub fn of(isa: &dyn TargetIsa) -> Self {
        let mut text = format!(
            "jitfold code context\njitfold {}\ncranelift {CRANELIFT_VERSION}\nkey format {KEY_FORMAT_VERSION}\ntriple {}\n",
            env!("CARGO_PKG_VERSION"),
            isa.triple()
        );
        push_settings(&mut text, "shared", isa.flags().iter().collect());
        push_settings(&mut text, "isa", isa.isa_flags());
        Self::from_text(text)
    }

    /// A context given by its canonical text (tests, and contexts that
    /// are not an ISA's).
    pub fn from_text(text: String) -> Self {
        let digest = *blake3::Hasher::new_derive_key("jitfold code store context")
            .update(text.as_bytes())
            .finalize()
            .as_bytes();
        Self { text, digest }
    }

    /// The canonical text, for messages and reports.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The 256-bit digest of the text, which entries carry.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
}

impl fmt::Debug for CodeContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CodeContext({})", hex(&self.digest[..8]))
    }
}

/// Appends one `group name=value` line per setting of `values`, sorted by
/// name so that the text does not depend on Cranelift's descriptor order.
fn push_settings(text: &mut String, group: &str, values: Vec<Value>) {
    let mut lines: Vec<String> = values.iter().map(|v| format!("{group} {v}\n")).collect();
    lines.sort();
    for line in lines {
        text.push_str(&line);
    }
}

/// The key of a stored entry: a 128-bit XXH3 hash of the entry format
/// version, the [`CodeContext`]'s digest and the template's key words, so
/// that one key names the code of one template in one context. Written as
/// 32 lowercase hex digits ([`StoreKey::hex`]), which is the file name in
/// a directory store.
///
/// XXH3 is fast (the key is computed at every lookup) and not
/// collision-resistant against someone who chooses the functions: two
/// templates may share a key. That is safe because an entry holds its
/// template's BLAKE3 and SHA-256 digests ([`Digests`](super::entry::Digests),
/// each collision-resistant) and [`Entry::decode`](super::Entry::decode)
/// compares one of them, so a collision is a miss (and the two templates take turns
/// in the store), never the other template's code.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey([u8; 16]);

impl StoreKey {
    /// The key of the code of `template` in `context`.
    pub fn of(context: &CodeContext, template: &Template) -> Self {
        Self::of_words(context, template.key())
    }

    /// The key of the code of the template whose key words are `words`.
    pub fn of_words(context: &CodeContext, words: &[u32]) -> Self {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(b"jitfold code store key");
        hasher.update(&FORMAT_VERSION.to_le_bytes());
        hasher.update(context.digest());
        hasher.update(&(words.len() as u64).to_le_bytes());
        words_le(words, |piece| hasher.update(piece));
        Self(hasher.digest128().to_le_bytes())
    }

    /// A key given by its bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The key as 32 lowercase hex digits.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// The key written as [`StoreKey::hex`] writes it; `None` for anything
    /// else (another length, uppercase or non-hex digits).
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.as_bytes();
        if text.len() != 32 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut bytes = [0u8; 16];
        for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Self(bytes))
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreKey({})", self.hex())
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 15)] as char);
    }
    text
}

/// Hands `words` to `update` as little-endian bytes: how both a
/// [`StoreKey`] and an entry's template digests
/// ([`template_digest`](super::entry::template_digest),
/// [`template_sha256`](super::entry::template_sha256)) hash a template's
/// key words.
/// (Both hashes are the same whatever pieces the bytes come in.)
pub(super) fn words_le(words: &[u32], mut update: impl FnMut(&[u8])) {
    // On a little-endian target the words' own bytes are those bytes: no
    // copy, and BLAKE3 sees all of a long key's chunks at once. (The copy
    // into a zeroed 8 KiB piece was most of a store key's time.)
    #[cfg(target_endian = "little")]
    update(bytemuck::cast_slice(words));
    #[cfg(not(target_endian = "little"))]
    {
        let mut piece = [0u8; 8192];
        for words in words.chunks(piece.len() / 4) {
            for (bytes, word) in piece.chunks_exact_mut(4).zip(words) {
                bytes.copy_from_slice(&word.to_le_bytes());
            }
            update(&piece[..words.len() * 4]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_other_text() {
        let key = StoreKey::from_bytes(core::array::from_fn(|i| (i * 37 + 5) as u8));
        let text = key.hex();
        assert_eq!(text.len(), 32);
        assert_eq!(StoreKey::from_hex(&text), Some(key));
        assert_eq!(StoreKey::from_hex(&text.to_uppercase()), None);
        assert_eq!(StoreKey::from_hex(&text[..31]), None);
        assert_eq!(StoreKey::from_hex(&format!("{text}0")), None);
        assert_eq!(StoreKey::from_hex(&format!("g{}", &text[1..])), None);
    }

    #[test]
    fn keys_differ_by_context_and_words_and_are_stable() {
        let a = CodeContext::from_text("a".into());
        let b = CodeContext::from_text("b".into());
        let key = StoreKey::of_words(&a, &[1, 2, 3]);
        assert_eq!(key, StoreKey::of_words(&a, &[1, 2, 3]));
        assert_ne!(key, StoreKey::of_words(&b, &[1, 2, 3]));
        assert_ne!(key, StoreKey::of_words(&a, &[1, 2, 4]));
        assert_ne!(key, StoreKey::of_words(&a, &[1, 2]));
        // Longer than one hashing piece: every word still counts.
        let long: Vec<u32> = (0..10_000).collect();
        let mut other = long.clone();
        other[9_999] = 0;
        assert_ne!(
            StoreKey::of_words(&a, &long),
            StoreKey::of_words(&a, &other)
        );
        // The words' little-endian bytes, one after the other: the same as
        // hashing them word by word.
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(b"jitfold code store key");
        hasher.update(&FORMAT_VERSION.to_le_bytes());
        hasher.update(a.digest());
        hasher.update(&(long.len() as u64).to_le_bytes());
        for word in &long {
            hasher.update(&word.to_le_bytes());
        }
        assert_eq!(
            StoreKey::of_words(&a, &long).as_bytes(),
            &hasher.digest128().to_le_bytes()
        );
        // The same in every process and on every machine: pinned.
        assert_eq!(
            StoreKey::of_words(&CodeContext::from_text(String::new()), &[]).hex()[..16],
            *PINNED_EMPTY_KEY_PREFIX
        );
    }

    /// The first 16 hex digits of the key of an empty template in an empty
    /// context, for this entry format version; a change means every stored
    /// key changes (and [`FORMAT_VERSION`] should too).
    const PINNED_EMPTY_KEY_PREFIX: &str = "c0ee1dbc959b80c6";
}
