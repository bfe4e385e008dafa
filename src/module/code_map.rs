//! Where each finalized function's code is in the JIT's memory, and which
//! function ids run it: what `DedupModule::functions_at` answers for
//! backtraces and profilers.
//!
//! # What this module guarantees
//!
//! An address inside a function's own code (its compiled code, or its
//! trampoline) maps to that function first, then to every duplicate that
//! runs the same code; an address outside every range maps to nothing.

use cranelift_module::FuncId;
use hashbrown::HashMap;
use std::collections::BTreeMap;

/// Where the finalized functions' code is: for backtraces and profilers.
#[derive(Default)]
pub(super) struct CodeMap {
    /// Code ranges by start address: (end, function).
    ranges: BTreeMap<usize, (usize, FuncId)>,
    /// For each function with duplicates, its duplicates.
    duplicates_of: HashMap<FuncId, Vec<FuncId>>,
}

impl CodeMap {
    /// Records that `id`'s own code is at `start..end`.
    pub(super) fn insert(&mut self, start: usize, end: usize, id: FuncId) {
        self.ranges.insert(start, (end, id));
    }

    /// Records that `duplicate` runs the code of `root`.
    pub(super) fn add_duplicate(&mut self, root: FuncId, duplicate: FuncId) {
        self.duplicates_of.entry(root).or_default().push(duplicate);
    }

    /// Every function whose code runs at `address` (see
    /// `DedupModule::functions_at`).
    pub(super) fn functions_at(&self, address: usize) -> Vec<FuncId> {
        let Some((_, &(end, owner))) = self.ranges.range(..=address).next_back() else {
            return Vec::new();
        };
        if address >= end {
            return Vec::new();
        }
        let mut ids = vec![owner];
        if let Some(duplicates) = self.duplicates_of.get(&owner) {
            ids.extend(duplicates);
        }
        ids
    }
}
