//! A persistent code store: compiled templates kept across runs and shared
//! across the processes of a fleet, so that a function compiled once is
//! defined from stored bytes everywhere after.
//!
//! The layers, from the bottom:
//!
//! - [`CodeStore`]: `get` and `put` of opaque bytes by [`StoreKey`], with
//!   four implementations: [`PackStore`] (embedded, for warm starts: a
//!   directory of pack files, each holding many entries, bounded in size),
//!   [`DirectoryStore`] (embedded: a directory of one file per entry,
//!   bounded in size), [`MemoryStore`] (a map in this process), and
//!   `RedisStore` (feature `redis`: a Redis server shared by a fleet).
//! - [`Entry`]: what the bytes are, a compiled template with its
//!   relocations by name slot, in a versioned binary format with a checksum
//!   and, with a [`Secret`], a MAC ([`Entry::encode`], [`Entry::decode`]).
//! - [`CodeContext`] and [`StoreKey`]: what code depends on besides the
//!   function (ISA, flags, versions), and the stable hash that names an
//!   entry in a store.
//!
//! A user of the store (such as [`crate::DedupModule`]) loads a template's
//! code with [`load::load`], the one path that looks the key up
//! ([`StoreKey::of`]), decodes the entry ([`Entry::decode`]) against the
//! same context and template and runs every check; on any miss it compiles
//! as if there were no store, then `put`s the new entry (which replaces a
//! rejected one).
//!
//! # What this module guarantees
//!
//! 1. A store never returns bytes that were not `put` under that key:
//!    every `get` returns `None` or the complete value of one `put` of that
//!    key (possibly an older one, possibly from another process), never a
//!    part of one or a mix of two. A store that cannot answer returns a
//!    [`StoreError`]; none panics on a failed backend.
//! 2. Decoding accepts only entries that pass every check listed in
//!    [`entry`]: truncated, flipped, foreign-version, foreign-context,
//!    foreign-template (a key collision, or an entry stored under another
//!    entry's key) and, with a secret, unauthenticated entries are
//!    rejected, with the reason.
//! 3. [`StoreKey`] is the same in every process and on every machine for
//!    a given context and template (no per-process seed).
//!
//! # Trust model
//!
//! An entry is machine code that the JIT will copy into executable memory
//! and run. Whoever can write to the store (the directory's files, the
//! Redis server, or the network path to it) can therefore choose the code
//! that every reader runs, **unless a [`Secret`] is configured**:
//!
//! - Without a secret, the checksum catches accidents (truncation, bit
//!   flips, torn writes, a collision, another version or ISA) but not an
//!   attacker, who can compute checksums too. Use a store without a secret
//!   only where every writer is trusted as much as the JIT's own process
//!   (a directory only its user can write, a Redis server on a private
//!   network with access control).
//! - With a secret, every entry carries a keyed BLAKE3 MAC over all of its
//!   bytes (the context, the template key, the code, the relocations), and
//!   an entry without a valid MAC is never used: a writer without the
//!   secret can delete, corrupt or swap entries (which costs compilations),
//!   but cannot make a reader run code of its choosing. The same holds of
//!   the digest an entry may hold of the function its compile verified
//!   ([`Entry::verified`]), which spares a `DedupModule` verifying that
//!   function again: it is trusted exactly as far as the code beside it.
//!   The secret must be
//!   kept like a signing key: anyone who has it can sign code that every
//!   process with it will run. Give each trust domain its own secret.
//! - The MAC does not hide the code (entries are not encrypted). It does
//!   not stop the replay of an older entry signed with the same secret for
//!   the same context and template: that is code the same compiler made
//!   for the same function, unless a jitfold or Cranelift build that
//!   compiles differently shares the context (a patched build with an
//!   unchanged version: give it another secret).
//! - Checks happen before anything of an entry is used: the checksum, then
//!   the MAC, then the context, the template and the code's structure (so
//!   a relocation cannot patch outside the code).
//!
//! # Unwind information
//!
//! Entries carry Cranelift's unwind information only with the
//! `store-unwind` feature; see [`entry`'s docs](entry#unwind-information)
//! for what a user of entries without it must do.

mod bound;
pub mod courier;
pub mod directory;
pub mod entry;
mod kept;
pub mod key;
pub mod load;
pub mod memory;
pub mod pack;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
mod redis_link;
pub mod shared;
mod slots;
pub mod writer;

pub use directory::DirectoryStore;
pub use entry::{Entry, EntryRejected, EntryReloc, EntryTarget, EntryUnwind, Secret};
pub use key::{CodeContext, StoreKey};
pub use memory::MemoryStore;
pub use pack::PackStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;
pub use shared::{SharedStats, SharedStore};

use std::fmt;
use std::path::PathBuf;

/// A key-value store of entries: the interface every backend implements.
///
/// Shared between threads (`Send + Sync`, `&self` methods) and usable as
/// `Arc<dyn CodeStore>`. Values are opaque bytes; what they mean is
/// [`Entry`]'s business, and a store does not look at them.
pub trait CodeStore: Send + Sync {
    /// The value last stored under `key` (by this or any other process
    /// sharing the store), or `None` if there is none. Never part of a
    /// value.
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError>;

    /// Stores `value` under `key`, replacing any value there. A store may
    /// drop values later (eviction, expiry); a `get` then misses.
    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError>;

    /// [`CodeStore::put`] of each of `entries`, in as few round trips as
    /// the backend allows (`RedisStore`: one pipeline per
    /// [`GET_MANY_CHUNK`] entries). Every entry is tried; the error is the
    /// first one, if any. By default, `put` of each. A batch flush of
    /// [`DedupModule`](crate::DedupModule) writes what it compiles this
    /// way, a few dozen entries at a time.
    fn put_many(&self, entries: &[(StoreKey, Vec<u8>)]) -> Result<(), StoreError> {
        let mut first_error = None;
        for (key, value) in entries {
            if let Err(e) = self.put(key, value) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// [`CodeStore::get`] of each of `keys`, in order, in as few round
    /// trips as the backend allows (`RedisStore`: a pipeline of bounded reads per
    /// [`GET_MANY_CHUNK`] keys). One error fails the whole call (a store
    /// that answers a failed backend as a miss, as [`SharedStore`] does,
    /// answers so here too); the caller may then `get` the keys one by
    /// one. By default, `get` of each key. A batch flush of
    /// [`DedupModule`](crate::DedupModule) passes at most
    /// [`GET_MANY_CHUNK`] keys per call.
    fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|key| self.get(key)).collect()
    }

    /// [`CodeStore::get`] for a caller that will compile the value and
    /// `put` it if there is none. A store shared by threads
    /// ([`SharedStore`]) reserves the key for the caller then, and makes
    /// other callers wait for its `put` instead of compiling the same
    /// value (for a while: see [`SharedStore::with_max_wait`]); the
    /// caller must end the reservation with `put` or
    /// [`CodeStore::release`]. By default, `get`.
    fn get_or_reserve(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.get(key)
    }

    /// [`CodeStore::get_or_reserve`] that never waits for another
    /// caller: [`Claim::Busy`] where another caller holds the key's
    /// reservation (it is compiling the value), so that the caller can do
    /// other work first and ask again later. A batch flush defers such
    /// functions to its end, so that runtimes defining one program divide
    /// its compiles instead of queueing on each other. By default,
    /// `get_or_reserve` (which then never says busy): a store that
    /// reserves keys and may wait in `get_or_reserve` should override it,
    /// or a flush waits where it meant to move on.
    fn try_get_or_reserve(&self, key: &StoreKey) -> Result<Claim, StoreError> {
        Ok(match self.get_or_reserve(key)? {
            Some(value) => Claim::Found(value),
            None => Claim::Reserved,
        })
    }

    /// [`CodeStore::try_get_or_reserve`] of each of `keys`, in order, in
    /// as few round trips as the backend allows (`RedisStore`: one
    /// pipeline per [`GET_MANY_CHUNK`] keys). On an error, the
    /// reservations it made are released (or, in Redis, expire). By
    /// default, `try_get_or_reserve` of each key.
    fn try_get_or_reserve_many(&self, keys: &[StoreKey]) -> Result<Vec<Claim>, StoreError> {
        let mut claims = Vec::with_capacity(keys.len());
        for key in keys {
            match self.try_get_or_reserve(key) {
                Ok(claim) => claims.push(claim),
                Err(e) => {
                    for (key, claim) in keys.iter().zip(&claims) {
                        if *claim == Claim::Reserved {
                            self.release(key);
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(claims)
    }

    /// Whether [`CodeStore::get_or_reserve`] reserves keys (does more than
    /// `get`). A batch flush asks again, with `get_or_reserve`, for a key
    /// that its [`CodeStore::get_many`] did not find only in a store that
    /// reserves, so that the store learns who compiles it; other stores are
    /// not asked twice. A module's flush waits for its entries to be
    /// written only in a store that reserves (elsewhere they are written
    /// behind it, see [`DedupModule::with_store`](crate::DedupModule::with_store)).
    /// By default, `false`; a store that overrides `get_or_reserve` to
    /// reserve should say `true` (one that does not holds its
    /// reservations until the module's writer writes their entries,
    /// behind the flush: others wait for them longer).
    fn reserves(&self) -> bool {
        false
    }

    /// Whether each call waits for an answer from another process (a
    /// server, over a network or a socket), so that a caller gains by
    /// making calls while it works: a batch flush then claims the
    /// templates of its next functions ([`CodeStore::try_get_or_reserve_many`])
    /// on a thread of its own while it compiles. By default, `false`.
    fn round_trips(&self) -> bool {
        false
    }

    /// Gives up a reservation made by [`CodeStore::get_or_reserve`] without
    /// a value (the compile failed, or made no entry): another caller may
    /// reserve the key. By default, nothing.
    fn release(&self, key: &StoreKey) {
        let _ = key;
    }
}

/// What [`CodeStore::try_get_or_reserve`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key's value.
    Found(Vec<u8>),
    /// No value: the key is the caller's to compile, and to end with `put`
    /// or [`CodeStore::release`].
    Reserved,
    /// No value, and another caller is compiling it.
    Busy,
}

/// The most keys a backend asks for in one command of
/// [`CodeStore::get_many`], so that no answer is larger than a few
/// megabytes of entries; also the most a batch flush passes to one call
/// (so that a failed call loses only that many entries).
pub const GET_MANY_CHUNK: usize = 256;

/// Why a store could not answer. Never a reason to fail compilation: the
/// caller compiles as if the store were not there.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// A file system operation of a [`DirectoryStore`] failed.
    Io {
        /// What was being done (`"read"`, `"write"`, `"rename"`, ...).
        operation: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A value is larger than the store keeps.
    TooLarge {
        /// The value's length.
        len: u64,
        /// The largest value the store keeps.
        limit: u64,
    },
    /// The Redis server could not be reached, did not answer within the
    /// timeout, or answered with an error (feature `redis`).
    #[cfg(feature = "redis")]
    Redis {
        /// What was being done (`"connect"`, `"GETRANGE"`, `"SET"`).
        operation: &'static str,
        /// The error.
        source: ::redis::RedisError,
    },
    /// A Redis server recently failed to connect and the store waits
    /// before trying it again (feature `redis`; see
    /// [`RedisStore::with_retry_interval`]).
    #[cfg(feature = "redis")]
    RedisBackingOff,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io {
                operation,
                path,
                source,
            } => write!(
                f,
                "code store: {operation} `{}` failed: {source}",
                path.display()
            ),
            Self::TooLarge { len, limit } => write!(
                f,
                "code store: a value of {len} bytes is larger than the {limit} bytes kept"
            ),
            #[cfg(feature = "redis")]
            Self::Redis { operation, source } => {
                write!(f, "code store: Redis {operation} failed: {source}")
            }
            #[cfg(feature = "redis")]
            Self::RedisBackingOff => write!(
                f,
                "code store: the Redis server could not be reached recently; not retrying yet"
            ),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            #[cfg(feature = "redis")]
            Self::Redis { source, .. } => Some(source),
            _ => None,
        }
    }
}

// A store is shared between the threads of a module behind an `Arc`.
const _: fn() = || {
    fn object_safe_and_shared<T: Send + Sync + ?Sized>() {}
    object_safe_and_shared::<dyn CodeStore>();
    object_safe_and_shared::<DirectoryStore>();
    object_safe_and_shared::<MemoryStore>();
    object_safe_and_shared::<PackStore>();
    object_safe_and_shared::<StoreError>();
};
