//! A code store shared by the JIT threads of one process, compiling each
//! template once: a thread that looks up a template another thread is
//! compiling waits for that thread's entry instead of compiling it again.
//!
//! Each thread keeps its own `DedupModule` (its own code memory and ids)
//! and shares one [`SharedStore`] through an `Arc`
//! ([`DedupModule::with_store`](crate::DedupModule::with_store)). A module
//! that needs a template [reserves](CodeStore::get_or_reserve) it; while it
//! compiles, no lock is held, and every other module that needs the same
//! template waits; the entry it [puts](CodeStore::put) wakes them, and they
//! define their functions from it. Optionally, a persistent store sits
//! behind it: a reserved template is looked up there (once, by the
//! reserving thread) before anyone compiles it, keys without a value are
//! looked up there by [`CodeStore::get`] and together by
//! [`CodeStore::get_many`] (a batch flush's lookup), and what is compiled
//! is written there too.
//!
//! # What this module guarantees
//!
//! 1. At most one reservation of a key exists at a time, and a key is
//!    reserved only while it has no value: as long as no reservation is
//!    given up or outlasts the longest wait (see 2), and no value is
//!    dropped to keep the bound (see 7), each template is compiled once in
//!    total, whatever the number of threads and their timing. (A
//!    reservation taken over is the new holder's; the first
//!    holder's later `put` is a value like any other, and its later
//!    release ends the new holder's reservation, so a third thread may
//!    compile the template too: a compile more, never a wrong value. So
//!    may the release of a holder whose reservation a value from the
//!    backing store ended, once that value is dropped and the key
//!    reserved again.)
//! 2. Waiting is bounded: a reservation older than [`DEFAULT_MAX_WAIT`]
//!    (set with [`SharedStore::with_max_wait`]) is taken over by a thread
//!    waiting for it, which compiles the template itself (which costs a
//!    compile, never a wrong value: both threads' values are code for the
//!    same template); the other waiters wait for that thread's
//!    reservation in turn, so that they do not all compile it at once (a
//!    thread waits for each reservation of the key at most the longest
//!    wait). A reservation is held from lookup to `put`
//!    or release. An eager module holds one at a time but while it defines
//!    the merged body of similar functions for the member it reserved
//!    (`similar.rs`); a batch flush holds the ones it claimed ahead and
//!    those of entries it has not written yet, and waits only after it has
//!    given the first up and written the others (7 and 9 in
//!    `src/module/stored.rs`). The bound ends every wait, including one
//!    on a reservation a module never gives up (a panic it did not catch,
//!    its module kept alive and idle) and any wait of two modules on each
//!    other's reservations.
//! 3. A reservation given up ([`CodeStore::release`], called by the module
//!    when its compile fails, panics or makes no entry) wakes the waiters,
//!    and one of them reserves the key in turn: an error on one thread
//!    does not leave another waiting.
//! 4. Lookups of keys in different shards (the map is split by key into
//!    64 independently locked parts) never wait for one another's lock.
//! 5. Values are copied in and out; nothing in the map is executed. A
//!    backing store that fails, or panics, is a miss (counted in its
//!    user's statistics only as this store's answer: a miss), and a value
//!    it gives for a key reserved never replaces one put meanwhile.
//! 6. [`CodeStore::try_get_or_reserve`] answers as `get_or_reserve` does,
//!    except that where another caller holds the reservation it says
//!    [`Claim::Busy`] at once instead of waiting: a batch flush then
//!    defines its other functions first (see `stored.rs` in
//!    `src/module/`), so that modules defining one program divide its
//!    compiles.
//! 7. The values held take at most the store's limit in bytes (their
//!    lengths: the map, the clock and each value's allocation add some 90
//!    bytes an entry besides), each of the 64 parts its share, but for the value put
//!    last in a part, kept whatever its size until the next. Past the
//!    limit, values go about least recently read or put first (a clock,
//!    `slots.rs`); a value dropped is a miss from then on, which the
//!    backing store, if any, may still answer: [`CodeStore::get`],
//!    [`CodeStore::get_many`] and a reservation ask it for a key without a
//!    value. A value may be dropped before the threads that waited for it
//!    read it, where it and the next values put in its part do not fit
//!    the part's share together (entries of 2 MiB and more at the default
//!    limit): one of them then compiles it again (and the others wait for
//!    that), or finds it in the backing store once written there.

use super::slots::{Slot, Slots};
use super::{Claim, CodeStore, StoreError, StoreKey};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a lookup waits for another thread's reservation by default
/// before taking it over (see 2 in the module docs): longer than Cranelift
/// takes to compile any function of the shared corpora (all 1,993 of the
/// largest, resvg, compile in about 2 s: table 2 of the README).
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// How many bytes of values a store holds by default (see 7 in the module
/// docs): some 350,000 functions' entries of the wasm corpora (700 to 770
/// bytes each in a directory, table 4 of the README). The values' lengths
/// are counted, not what holding them costs besides.
pub const DEFAULT_LIMIT: u64 = 256 << 20;

/// How many independently locked parts the map has: lookups of different
/// keys from different threads rarely wait for one another.
const SHARDS: usize = 64;

/// One part of the map, with its own lock.
struct Shard {
    slots: Mutex<Slots>,
    /// Signalled whenever a reservation of this shard ends (a value put,
    /// or released).
    changed: Condvar,
}

/// A code store in memory, shared by threads, that compiles each template
/// once (see the [module docs](self)).
pub struct SharedStore {
    shards: Box<[Shard]>,
    backing: Option<Arc<dyn CodeStore>>,
    max_wait: Duration,
    waits: AtomicU64,
    waited_nanos: AtomicU64,
    reservations: AtomicU64,
    limit: u64,
}

/// What a [`SharedStore`] counted so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedStats {
    /// Templates handed to a thread to compile (reservations the backing
    /// store, if any, had no value for).
    pub reservations: u64,
    /// Lookups that waited for another thread's compile.
    pub waits: u64,
    /// Time spent waiting, summed over threads.
    pub waited: Duration,
    /// Values held.
    pub entries: u64,
    /// Bytes of the values held.
    pub bytes: u64,
    /// Values dropped to keep the store within its limit (see
    /// [`SharedStore::with_limit`]).
    pub evicted: u64,
}

impl Default for SharedStore {
    fn default() -> Self {
        Self {
            shards: shards(DEFAULT_LIMIT),
            backing: None,
            max_wait: DEFAULT_MAX_WAIT,
            waits: AtomicU64::new(0),
            waited_nanos: AtomicU64::new(0),
            reservations: AtomicU64::new(0),
            limit: DEFAULT_LIMIT,
        }
    }
}

/// The shards of a store holding at most `limit` bytes of values, each
/// its share.
fn shards(limit: u64) -> Box<[Shard]> {
    let share = limit / SHARDS as u64;
    (0..SHARDS)
        .map(|_| Shard {
            slots: Mutex::new(Slots::new(share)),
            changed: Condvar::new(),
        })
        .collect()
}

impl SharedStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store in front of `backing` (a persistent store): a key
    /// without a value is looked up there (a reserved one before anyone
    /// compiles it), and values put are written there too.
    pub fn backed_by(backing: Arc<dyn CodeStore>) -> Self {
        Self {
            backing: Some(backing),
            ..Self::default()
        }
    }

    /// This store with lookups waiting at most `max_wait` for another
    /// thread's reservation (see 2 in the module docs).
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// This store holding at most `limit` bytes of values
    /// ([`DEFAULT_LIMIT`] otherwise), dropping about the least recently
    /// used first (see 7 in the module docs; each of its 64 parts keeps
    /// the value put last in it, so with a limit under 64 bytes, each
    /// holds just that one). Call it before the store is used: what it
    /// holds and counted so far is dropped.
    pub fn with_limit(mut self, limit: u64) -> Self {
        self.shards = shards(limit);
        self.limit = limit;
        self
    }

    /// The most bytes of values it holds, but for the value put last in
    /// each of its parts (see 7 in the module docs).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The shard that holds `key` (keys are hashes: any bits will do).
    fn shard(&self, key: &StoreKey) -> &Shard {
        &self.shards[usize::from(key.as_bytes()[0]) % self.shards.len()]
    }

    /// What it counted so far.
    pub fn stats(&self) -> SharedStats {
        SharedStats {
            reservations: self.reservations.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            waited: Duration::from_nanos(self.waited_nanos.load(Ordering::Relaxed)),
            ..self
                .shards
                .iter()
                .fold(SharedStats::default(), |sum, shard| {
                    let slots = shard.lock();
                    let (entries, bytes) = slots.held();
                    SharedStats {
                        entries: sum.entries + entries,
                        bytes: sum.bytes + bytes,
                        evicted: sum.evicted + slots.dropped(),
                        ..sum
                    }
                })
        }
    }

    /// Makes `value` the value of `key`, ending any reservation, and wakes
    /// the waiters.
    fn fill(&self, key: &StoreKey, value: Arc<[u8]>) {
        let shard = self.shard(key);
        shard.lock().put(*key, value, false);
        shard.changed.notify_all();
    }

    /// [`SharedStore::fill`], unless `key` has a value already (put while
    /// `value` was read from the backing store: the one compiled here is
    /// kept).
    fn fill_unless_ready(&self, key: &StoreKey, value: Arc<[u8]>) {
        let shard = self.shard(key);
        let put = shard.lock().put(*key, value, true);
        if put {
            shard.changed.notify_all();
        }
    }
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        // No operation of `Slots` panics between its changes, and nothing
        // between them in a critical section changes them, so a panic
        // while the lock was held leaves consistent slots.
        self.slots
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl CodeStore for SharedStore {
    /// The value held, or else the backing store's, which is then held
    /// unless a value was put meanwhile (a reservation of the key ends, as
    /// when its value is put). Reserves nothing; a backing store that
    /// fails, or panics, is a miss, as in `get_or_reserve`.
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(value) = self.shard(key).lock().read(key) {
            return Ok(Some(value));
        }
        Ok(self.backing_value(key))
    }

    /// The values held, and for the keys without one, the backing store's
    /// values in one [`CodeStore::get_many`], which are then held unless a
    /// value was put meanwhile (a reservation of such a key ends, as when
    /// its value is put). Reserves nothing; a backing store that fails is a
    /// miss, as in `get_or_reserve`.
    fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut values: Vec<Option<Vec<u8>>> = keys
            .iter()
            .map(|key| self.shard(key).lock().read(key))
            .collect();
        let Some(backing) = &self.backing else {
            return Ok(values);
        };
        let missing: Vec<usize> = (0..keys.len()).filter(|&i| values[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(values);
        }
        let asked: Vec<StoreKey> = missing.iter().map(|&i| keys[i]).collect();
        if let Ok(found) = backing.get_many(&asked) {
            for (i, value) in missing.into_iter().zip(found) {
                if let Some(value) = value {
                    self.fill_unless_ready(&keys[i], value.as_slice().into());
                    values[i] = Some(value);
                }
            }
        }
        Ok(values)
    }

    fn get_or_reserve(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(match self.claim(key, true) {
            Claim::Found(value) => Some(value),
            Claim::Reserved => None,
            Claim::Busy => unreachable!("a claim that waits is never busy"),
        })
    }

    /// Never waits (see 6 in the module docs).
    fn try_get_or_reserve(&self, key: &StoreKey) -> Result<Claim, StoreError> {
        Ok(self.claim(key, false))
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        self.fill(key, value.into());
        match &self.backing {
            Some(backing) => backing.put(key, value),
            None => Ok(()),
        }
    }

    fn put_many(&self, entries: &[(StoreKey, Vec<u8>)]) -> Result<(), StoreError> {
        for (key, value) in entries {
            self.fill(key, value.as_slice().into());
        }
        match &self.backing {
            Some(backing) => backing.put_many(entries),
            None => Ok(()),
        }
    }

    fn reserves(&self) -> bool {
        true
    }

    fn release(&self, key: &StoreKey) {
        let shard = self.shard(key);
        shard.lock().release(key);
        shard.changed.notify_all();
    }
}

impl SharedStore {
    /// The value of `key`, or its reservation for the caller; where
    /// another caller holds the reservation, [`Claim::Busy`] at once
    /// unless `wait`, else waiting (at most the longest wait, then taking
    /// it over: see 2 in the module docs).
    fn claim(&self, key: &StoreKey, wait: bool) -> Claim {
        let shard = self.shard(key);
        let mut slots = shard.lock();
        let mut waited_since: Option<Instant> = None;
        loop {
            // A value first, in one lookup (a module's usual claim).
            if let Some(value) = slots.read(key) {
                drop(slots);
                self.count_wait(waited_since);
                return Claim::Found(value);
            }
            match slots.get(key) {
                // Read above: none.
                Some(Slot::Ready { .. }) | None => break,
                Some(Slot::Reserved(_)) if !wait => return Claim::Busy,
                Some(Slot::Reserved(made)) => {
                    waited_since.get_or_insert_with(Instant::now);
                    // A reservation is taken over once it is older than
                    // the longest wait (see 2 in the module docs): one
                    // another waiter just took over is waited for, so
                    // that waiters do not all take it at once.
                    let Some(left) = self.max_wait.checked_sub(made.elapsed()) else {
                        break;
                    };
                    slots = shard
                        .changed
                        .wait_timeout(slots, left)
                        .unwrap_or_else(|poison| poison.into_inner())
                        .0;
                }
            }
        }
        slots.reserve(*key, Instant::now());
        drop(slots);
        self.count_wait(waited_since);
        // Reserved: the backing store may have it (asked without the lock;
        // others wait meanwhile, as for a compile). A backing store that
        // fails, or panics, is a miss: the caller holds the reservation,
        // and compiles.
        if let Some(value) = self.backing_value(key) {
            return Claim::Found(value);
        }
        self.reservations.fetch_add(1, Ordering::Relaxed);
        Claim::Reserved
    }

    /// Counts a lookup that waited since `start`, if it waited.
    fn count_wait(&self, start: Option<Instant>) {
        if let Some(start) = start {
            self.waits.fetch_add(1, Ordering::Relaxed);
            let nanos = start.elapsed().as_nanos() as u64;
            self.waited_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }

    /// The backing store's value of `key`, if it has one, then held
    /// unless a value was put meanwhile (by a holder whose reservation
    /// was taken over): a backing store that fails, or panics, is a miss.
    fn backing_value(&self, key: &StoreKey) -> Option<Vec<u8>> {
        let backing = self.backing.as_ref()?;
        let asked = catch_unwind(AssertUnwindSafe(|| backing.get(key)));
        let Ok(Ok(Some(value))) = asked else {
            return None;
        };
        self.fill_unless_ready(key, value.as_slice().into());
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_bytes([n; 16])
    }

    /// The value of `key` in `store`, or, where `store` reserves it for
    /// the caller, `b"code"` "compiled" in `compile` and put.
    fn value_or_compiled(store: &SharedStore, key: &StoreKey, compile: Duration) -> Vec<u8> {
        match store.get_or_reserve(key).unwrap() {
            Some(value) => value,
            None => {
                std::thread::sleep(compile);
                store.put(key, b"code").unwrap();
                b"code".to_vec()
            }
        }
    }

    #[test]
    fn one_thread_reserves_the_others_wait_for_its_value() {
        let store = Arc::new(SharedStore::new());
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (store, barrier) = (store.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    // The one reservation "compiles", then puts.
                    value_or_compiled(&store, &key(1), Duration::from_millis(20))
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), b"code");
        }
        let stats = store.stats();
        assert_eq!(stats.reservations, 1);
        assert_eq!(stats.entries, 1);
    }

    /// A reservation never given up passes to a waiter once it is as old
    /// as the longest wait; the first holder's late release leaves the
    /// value the waiter put.
    #[test]
    fn a_reservation_held_too_long_is_taken_over() {
        let store = Arc::new(SharedStore::new().with_max_wait(Duration::from_millis(50)));
        let start = Instant::now();
        assert_eq!(store.get_or_reserve(&key(3)).unwrap(), None);
        let waiter = {
            let store = store.clone();
            std::thread::spawn(move || {
                let got = store.get_or_reserve(&key(3)).unwrap();
                (got, start.elapsed())
            })
        };
        let (got, waited) = waiter.join().unwrap();
        assert_eq!(got, None, "taken over: the waiter compiles it");
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        let stats = store.stats();
        assert_eq!((stats.reservations, stats.waits), (2, 1));
        store.put(&key(3), b"code").unwrap();
        store.release(&key(3));
        assert_eq!(
            store.get_or_reserve(&key(3)).unwrap().as_deref(),
            Some(&b"code"[..])
        );
    }

    #[test]
    fn a_released_or_abandoned_reservation_passes_to_a_waiter() {
        let store = Arc::new(SharedStore::new());
        assert_eq!(store.get_or_reserve(&key(2)).unwrap(), None);
        let waiter = {
            let store = store.clone();
            std::thread::spawn(move || {
                // Blocks until the reservation ends, then reserves itself.
                let found = store.get_or_reserve(&key(2)).unwrap();
                if found.is_none() {
                    store.put(&key(2), b"second").unwrap();
                }
                found
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        // The first "compile" fails: released, not put.
        store.release(&key(2));
        assert_eq!(waiter.join().unwrap(), None);
        assert_eq!(store.get(&key(2)).unwrap().as_deref(), Some(&b"second"[..]));
        // A thread that panics holding a reservation: the module releases
        // it (its compile runs under catch_unwind); releasing a key that
        // has a value changes nothing.
        store.release(&key(2));
        assert_eq!(store.get(&key(2)).unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(store.stats().reservations, 2);
    }

    #[test]
    fn a_backing_store_is_asked_once_per_reservation_and_written_through() {
        let backing = Arc::new(super::super::MemoryStore::new());
        backing.put(&key(3), b"stored").unwrap();
        let store = SharedStore::backed_by(backing.clone());
        assert_eq!(
            store.get_or_reserve(&key(3)).unwrap().as_deref(),
            Some(&b"stored"[..])
        );
        assert_eq!(store.get(&key(3)).unwrap().as_deref(), Some(&b"stored"[..]));
        assert_eq!(store.get_or_reserve(&key(4)).unwrap(), None);
        store.put(&key(4), b"new").unwrap();
        assert_eq!(backing.get(&key(4)).unwrap().as_deref(), Some(&b"new"[..]));
    }

    /// Keys 0 to 255 fall four to a part (the part is the first byte's
    /// remainder by 64); each part holds one of the 600-byte values.
    #[test]
    fn values_past_the_limit_are_dropped_and_the_backing_store_still_has_them() {
        let backing = Arc::new(super::super::MemoryStore::new());
        let bounded = |backing: Option<Arc<super::super::MemoryStore>>| {
            let store = match backing {
                Some(backing) => SharedStore::backed_by(backing),
                None => SharedStore::new(),
            };
            let store = store.with_limit(64 * 1000);
            for n in 0..=255u8 {
                store.put(&key(n), &[n; 600]).unwrap();
            }
            store
        };
        let store = bounded(Some(backing.clone()));
        let stats = store.stats();
        assert_eq!((stats.entries, stats.bytes), (64, 64 * 600));
        assert_eq!(stats.evicted, 192);
        assert_eq!(store.limit(), 64 * 1000);
        // Key 0's value was dropped, the newest of its part kept.
        assert_eq!(store.get(&key(192)).unwrap(), Some(vec![192; 600]));
        assert_eq!(backing.get(&key(0)).unwrap(), Some(vec![0; 600]));
        // Asked of the backing store, and held again (dropping key 192's).
        assert_eq!(store.get(&key(0)).unwrap(), Some(vec![0; 600]));
        assert_eq!(store.get_many(&[key(64)]).unwrap(), [Some(vec![64; 600])]);
        assert_eq!(
            store.get_or_reserve(&key(128)).unwrap(),
            Some(vec![128; 600])
        );
        assert_eq!(store.stats().reservations, 0);
        // Without a backing store, a value dropped is a miss, and the next
        // module to need it compiles it.
        let alone = bounded(None);
        assert_eq!(alone.get(&key(0)).unwrap(), None);
        assert_eq!(alone.get_or_reserve(&key(0)).unwrap(), None);
        assert_eq!(alone.stats().reservations, 1);
    }

    /// A backing store that records the keys of each `get_many`.
    #[derive(Default)]
    struct Recording {
        inner: super::super::MemoryStore,
        asked: Mutex<Vec<Vec<StoreKey>>>,
    }

    impl CodeStore for Recording {
        fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
            self.inner.get(key)
        }

        fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
            self.inner.put(key, value)
        }

        fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
            self.asked.lock().unwrap().push(keys.to_vec());
            self.inner.get_many(keys)
        }
    }

    #[test]
    fn get_many_asks_the_backing_store_once_for_what_it_does_not_hold() {
        let backing = Arc::new(Recording::default());
        backing.put(&key(5), b"stored").unwrap();
        let store = SharedStore::backed_by(backing.clone());
        store.put(&key(6), b"held").unwrap();
        // Key 7 is reserved by a thread compiling it.
        assert_eq!(store.get_or_reserve(&key(7)).unwrap(), None);
        let values = store.get_many(&[key(5), key(6), key(7), key(8)]).unwrap();
        assert_eq!(
            values,
            [Some(b"stored".to_vec()), Some(b"held".to_vec()), None, None]
        );
        assert_eq!(
            *backing.asked.lock().unwrap(),
            [vec![key(5), key(7), key(8)]]
        );
        // What the backing store had is held now; nothing was reserved.
        assert_eq!(store.get(&key(5)).unwrap().as_deref(), Some(&b"stored"[..]));
        assert_eq!(store.stats().reservations, 1);
        // The reservation of key 7 still ends with its put.
        store.put(&key(7), b"compiled").unwrap();
        assert_eq!(
            store.get(&key(7)).unwrap().as_deref(),
            Some(&b"compiled"[..])
        );
    }

    /// A backing store holding an old value of key 9, while the store in
    /// front of it is given a new one during the batched lookup.
    #[derive(Default)]
    struct Racing {
        front: std::sync::OnceLock<std::sync::Weak<SharedStore>>,
    }

    impl CodeStore for Racing {
        fn get(&self, _: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(Some(b"old".to_vec()))
        }

        fn put(&self, _: &StoreKey, _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }

        fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
            let front = self.front.get().and_then(std::sync::Weak::upgrade).unwrap();
            front.put(&key(9), b"new").unwrap();
            Ok(keys.iter().map(|_| Some(b"old".to_vec())).collect())
        }
    }

    #[test]
    fn get_many_keeps_a_value_put_while_it_asked_the_backing_store() {
        let backing = Arc::new(Racing::default());
        let store = Arc::new(SharedStore::backed_by(backing.clone()));
        backing.front.set(Arc::downgrade(&store)).unwrap();
        let values = store.get_many(&[key(9)]).unwrap();
        assert_eq!(values, [Some(b"old".to_vec())]);
        assert_eq!(store.get(&key(9)).unwrap().as_deref(), Some(&b"new"[..]));
    }

    /// A backing store whose `get` runs `on_get` first (and panics if it
    /// says so).
    struct Hooked<F: Fn(&StoreKey) -> Option<Vec<u8>> + Send + Sync>(F);

    impl<F: Fn(&StoreKey) -> Option<Vec<u8>> + Send + Sync> CodeStore for Hooked<F> {
        fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
            Ok((self.0)(key))
        }

        fn put(&self, _: &StoreKey, _: &[u8]) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// A backing store that panics while a key is reserved is a miss: the
    /// caller holds the reservation, and its put ends it, so nobody waits.
    #[test]
    fn a_backing_store_that_panics_is_a_miss_and_leaves_no_reservation_behind() {
        let backing = Arc::new(Hooked(|_: &StoreKey| -> Option<Vec<u8>> {
            panic!("the backing store panics")
        }));
        let store = SharedStore::backed_by(backing).with_max_wait(Duration::from_secs(30));
        assert_eq!(store.get_or_reserve(&key(1)).unwrap(), None);
        assert_eq!(store.try_get_or_reserve(&key(1)).unwrap(), Claim::Busy);
        store.put(&key(1), b"compiled").unwrap();
        let start = Instant::now();
        assert_eq!(
            store.get_or_reserve(&key(1)).unwrap().as_deref(),
            Some(&b"compiled"[..])
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(store.stats().reservations, 1);
    }

    /// A value put while the backing store was asked for a reserved key
    /// (by a holder whose reservation was taken over) is kept.
    #[test]
    fn a_value_put_while_the_backing_store_is_asked_is_kept() {
        let shared: Arc<std::sync::OnceLock<Arc<SharedStore>>> = Arc::default();
        let front = shared.clone();
        let backing = Arc::new(Hooked(move |key: &StoreKey| {
            front.get().unwrap().put(key, b"new").unwrap();
            Some(b"old".to_vec())
        }));
        let store = Arc::new(SharedStore::backed_by(backing));
        assert!(shared.set(store.clone()).is_ok());
        assert_eq!(
            store.get_or_reserve(&key(2)).unwrap().as_deref(),
            Some(&b"old"[..])
        );
        assert_eq!(store.get(&key(2)).unwrap().as_deref(), Some(&b"new"[..]));
        assert_eq!(store.stats().reservations, 0);
    }

    /// A reservation never given up passes to one waiter once it is older
    /// than the longest wait; the others wait for that waiter's value
    /// instead of all compiling the template at once.
    #[test]
    fn one_waiter_takes_a_reservation_over_and_the_others_wait_for_it() {
        let store = Arc::new(SharedStore::new().with_max_wait(Duration::from_millis(200)));
        assert_eq!(store.get_or_reserve(&key(3)).unwrap(), None);
        let waiters: Vec<_> = (0..4)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(30 * i));
                    // Taken over: compiling takes a while.
                    value_or_compiled(&store, &key(3), Duration::from_millis(100))
                })
            })
            .collect();
        for waiter in waiters {
            assert_eq!(waiter.join().unwrap(), b"code");
        }
        assert_eq!(store.stats().reservations, 2);
    }
}
