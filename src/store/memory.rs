//! A code store in this process's memory: for tests, and for sharing
//! compiled code between modules of one process without a directory.
//!
//! # What this module guarantees
//!
//! A `get` returns a copy of the value of the last `put` of that key
//! (every operation takes one lock), and nothing is ever evicted. No
//! operation fails.

use super::{CodeStore, StoreError, StoreKey};
use hashbrown::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A code store in a map behind a mutex. Unbounded: it holds every value
/// put into it until dropped.
#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: Mutex<HashMap<StoreKey, Box<[u8]>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Bytes of the values it holds.
    pub fn bytes(&self) -> u64 {
        self.lock().values().map(|v| v.len() as u64).sum()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<StoreKey, Box<[u8]>>> {
        // A panic while the lock was held cannot leave the map half
        // updated (each operation is one map call), so a poisoned lock is
        // still a consistent map.
        self.entries
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl CodeStore for MemoryStore {
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().get(key).map(|v| v.to_vec()))
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        self.lock().insert(*key, value.into());
        Ok(())
    }
}
