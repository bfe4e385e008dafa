//! Signatures and external functions numbered by their content, so that a
//! callee or a signature declared twice is one declaration in the key.
//!
//! # Why content is enough
//!
//! Cranelift reads these declarations only for what they say: call
//! lowering reads the callee's name, signature and flags
//! (`func_ref_data` in `machinst/isle.rs`), and the ABI code computes each
//! signature's layout from its parameters (`SigSet` in `machinst/abi.rs`).
//! The one exception, `func_addr`, is pure, and the mid-end merges two of
//! them only when they name the same `FuncRef`; the walk writes the
//! identity of a `func_addr`'s declaration beside its content.

use super::process_hasher;
use core::hash::BuildHasher;

/// The first word of a signature's definition (see [`Declarations`]).
pub(super) const DECLARED_SIGNATURE: u32 = 0xffff_ff01;
/// The first word of an external function's definition.
pub(super) const DECLARED_FUNCTION: u32 = 0xffff_ff02;

/// Signatures and external functions numbered by content: two declarations
/// with equal content get one number, whatever their `SigRef` or `FuncRef`.
///
/// Cranelift reads these declarations only for their content (call
/// lowering reads the callee's name, signature and flags; the ABI code
/// computes a signature's layout from its parameters), so two functions
/// that differ only in how often a callee or a signature is declared
/// compile to the same code. The exception is `func_addr`, which the
/// mid-end merges only with a `func_addr` of the same `FuncRef`: the walk
/// writes its identity beside its content.
///
/// The first time a content is seen, its definition (a `DECLARED_*` word,
/// then the content with nested declarations by their numbers) is written
/// into the key; a use writes only the number. Numbers count distinct
/// contents in first-use order, per kind.
#[derive(Default)]
pub(super) struct Declarations {
    /// The contents seen so far, one after another.
    words: Vec<u32>,
    /// Where in `words` each content is: `(start, end, number)`.
    table: hashbrown::HashTable<(u32, u32, u32)>,
    /// Distinct signatures and external functions so far.
    signatures: u32,
    functions: u32,
    /// Where the content being built starts in `words`.
    start: usize,
}

impl Declarations {
    pub(super) fn clear(&mut self) {
        self.words.clear();
        self.table.clear();
        self.signatures = 0;
        self.functions = 0;
    }

    /// Starts the content of a declaration of kind `kind` (a
    /// `DECLARED_*` word); the caller appends the rest to the buffer
    /// returned, then calls [`Declarations::intern`].
    pub(super) fn start(&mut self, kind: u32) -> &mut Vec<u32> {
        self.start = self.words.len();
        self.words.push(kind);
        &mut self.words
    }

    /// The number of the content just built; if it is new, writes its
    /// definition into `out`.
    pub(super) fn intern(&mut self, out: &mut Vec<u32>) -> u32 {
        let start = self.start;
        let content = &self.words[start..];
        let hash = process_hasher().hash_one(content);
        let words = &self.words;
        if let Some(&(_, _, n)) = self.table.find(hash, |&(s, e, _)| {
            words[s as usize..e as usize] == words[start..]
        }) {
            self.words.truncate(start);
            return n;
        }
        let counter = if self.words[start] == DECLARED_SIGNATURE {
            &mut self.signatures
        } else {
            &mut self.functions
        };
        let n = *counter;
        *counter += 1;
        out.extend_from_slice(&self.words[start..]);
        let entry = (start as u32, self.words.len() as u32, n);
        let words = &self.words;
        self.table.insert_unique(hash, entry, |&(s, e, _)| {
            process_hasher().hash_one(&words[s as usize..e as usize])
        });
        n
    }
}
