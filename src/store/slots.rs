//! What one shard of a [`SharedStore`](super::SharedStore) holds: for each
//! key, its reservation or its value, the values bounded in bytes.
//!
//! # What this module guarantees
//!
//! 1. A key has at most one slot: reserved (at an instant) or a value.
//!    Only [`Slots::reserve`] makes a reservation, and only of a key
//!    without a value (a reservation it replaces is taken over); only
//!    [`Slots::release`] and a value put end one.
//! 2. The values held take at most the shard's limit in bytes (their
//!    lengths; what holding them costs besides is not counted), but for
//!    the value put last, which is kept whatever its size until the next
//!    value is put: a value is never dropped by the put that makes it.
//!    (A later put may drop it before the threads waiting for it read it,
//!    when the two do not fit the limit together: see 1 in `shared.rs`.)
//! 3. When a put passes the limit, values are dropped in the order of a
//!    clock over the values held, oldest first (a value put again keeps
//!    its place), approximating least recently used: a value read since
//!    the clock last passed it (or put since) is passed over once, its
//!    mark cleared. Each put visits each value at most twice, and stops
//!    once only the value it put is left, so a put takes time linear in
//!    the values it drops and passes.
//! 4. Reservations are never dropped to keep the bound (they hold no
//!    value); a dropped value is a miss from then on, as if never put.

use super::StoreKey;
use hashbrown::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// What a shard holds for a key.
pub(super) enum Slot {
    /// A thread reserved it (at that instant) and is compiling it.
    Reserved(Instant),
    /// Its value, and whether it was read (or put) since the clock last
    /// passed it.
    Ready { value: Arc<[u8]>, used: bool },
}

/// The slots of one shard, with the values' clock and size (see the
/// [module docs](self)).
pub(super) struct Slots {
    slots: HashMap<StoreKey, Slot>,
    /// Every key with a value, each once, in the clock's order: the front
    /// is the next looked at.
    clock: VecDeque<StoreKey>,
    /// Bytes of the values held.
    bytes: u64,
    /// The most bytes of values held (see 2 above).
    limit: u64,
    /// Values dropped to keep the bound so far.
    dropped: u64,
}

impl Slots {
    /// No slots, values bounded to `limit` bytes.
    pub(super) fn new(limit: u64) -> Self {
        Self {
            slots: HashMap::new(),
            clock: VecDeque::new(),
            bytes: 0,
            limit,
            dropped: 0,
        }
    }

    /// The slot of `key`, as it is; reading a value this way does not
    /// mark it read (see [`Slots::read`]).
    pub(super) fn get(&self, key: &StoreKey) -> Option<&Slot> {
        self.slots.get(key)
    }

    /// The value of `key`, if it has one, marked as read.
    pub(super) fn read(&mut self, key: &StoreKey) -> Option<Vec<u8>> {
        match self.slots.get_mut(key) {
            Some(Slot::Ready { value, used }) => {
                *used = true;
                Some(value.to_vec())
            }
            Some(Slot::Reserved(_)) | None => None,
        }
    }

    /// Reserves `key`, which has no value, as of `now`, taking over its
    /// reservation if it has one (see 1 above).
    pub(super) fn reserve(&mut self, key: StoreKey, now: Instant) {
        // Checked before anything changes: a key with a value stays so.
        assert!(
            !matches!(self.slots.get(&key), Some(Slot::Ready { .. })),
            "a key with a value reserved"
        );
        self.slots.insert(key, Slot::Reserved(now));
    }

    /// Ends the reservation of `key`, if it has one; a value stays.
    pub(super) fn release(&mut self, key: &StoreKey) {
        if let Some(Slot::Reserved(_)) = self.slots.get(key) {
            self.slots.remove(key);
        }
    }

    /// Makes `value` the value of `key`, ending its reservation if any,
    /// unless `keep_held` and it has a value already; then drops values
    /// until the bound holds (see 2 and 3 above). Returns whether `value`
    /// was put.
    pub(super) fn put(&mut self, key: StoreKey, value: Arc<[u8]>, keep_held: bool) -> bool {
        let len = value.len() as u64;
        match self.slots.get_mut(&key) {
            Some(Slot::Ready { .. }) if keep_held => return false,
            Some(Slot::Ready { value: old, used }) => {
                self.bytes -= old.len() as u64;
                *old = value;
                *used = true;
            }
            // Reserved, or no slot: a new value. The clock first: should
            // it fail to grow, the key has no value, as before.
            Some(Slot::Reserved(_)) | None => {
                self.clock.push_back(key);
                self.slots.insert(key, Slot::Ready { value, used: true });
            }
        }
        self.bytes += len;
        self.keep_bound(&key);
        true
    }

    /// Drops values in the clock's order, passing over those read since
    /// it last passed them and `kept` (the value just put), until the
    /// values held fit the limit or only `kept` is left (see 3 above;
    /// `kept` has a value, so the clock is never empty here).
    fn keep_bound(&mut self, kept: &StoreKey) {
        // Each value is looked at at most twice: once to clear its mark,
        // once to drop it.
        let mut looks = 2 * self.clock.len();
        while self.bytes > self.limit && looks > 0 && self.clock.len() > 1 {
            looks -= 1;
            let Some(key) = self.clock.pop_front() else {
                break;
            };
            match self.slots.get_mut(&key) {
                Some(Slot::Ready { used, .. }) if *used || key == *kept => {
                    *used = false;
                    self.clock.push_back(key);
                }
                Some(Slot::Ready { value, .. }) => {
                    self.bytes -= value.len() as u64;
                    self.slots.remove(&key);
                    self.dropped += 1;
                }
                Some(Slot::Reserved(_)) | None => {
                    unreachable!("the clock holds only keys with a value")
                }
            }
        }
    }

    /// How many values, and how many bytes of them, are held.
    pub(super) fn held(&self) -> (u64, u64) {
        (self.clock.len() as u64, self.bytes)
    }

    /// Values dropped to keep the bound so far.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_bytes([n; 16])
    }

    fn value(len: usize) -> Arc<[u8]> {
        vec![7; len].into()
    }

    #[test]
    fn values_past_the_limit_are_dropped_oldest_first() {
        let mut slots = Slots::new(300);
        for n in 0..3 {
            assert!(slots.put(key(n), value(100), false));
        }
        assert_eq!(slots.held(), (3, 300));
        // A fourth passes the limit: every mark is cleared once, then the
        // oldest goes.
        slots.put(key(3), value(100), false);
        assert_eq!(slots.held(), (3, 300));
        assert!(slots.get(&key(0)).is_none());
        assert_eq!(slots.dropped(), 1);
        // The oldest left, unread, goes next.
        slots.put(key(4), value(100), false);
        assert!(slots.get(&key(1)).is_none());
        assert!(slots.read(&key(4)).is_some());
    }

    #[test]
    fn a_value_read_since_the_clock_passed_it_is_passed_over_once() {
        let mut slots = Slots::new(300);
        for n in 0..4 {
            slots.put(key(n), value(100), false);
        }
        // Keys 1, 2 and 3 are held, their marks cleared by the sweep that
        // dropped key 0; key 1 is read since.
        assert!(slots.read(&key(1)).is_some());
        slots.put(key(4), value(100), false);
        assert!(slots.read(&key(1)).is_some(), "read, so passed over");
        assert!(slots.get(&key(2)).is_none(), "unread, so dropped");
    }

    #[test]
    fn a_value_larger_than_the_limit_stays_until_the_next_put() {
        let mut slots = Slots::new(100);
        slots.put(key(1), value(50), false);
        slots.put(key(2), value(500), false);
        assert_eq!(slots.held(), (1, 500), "the older value goes, not the new");
        assert!(slots.read(&key(2)).is_some());
        slots.put(key(3), value(10), false);
        assert_eq!(slots.held(), (1, 10));
    }

    #[test]
    fn reservations_are_not_values_and_a_put_ends_them() {
        let mut slots = Slots::new(100);
        slots.reserve(key(1), Instant::now());
        slots.reserve(key(2), Instant::now());
        slots.put(key(3), value(100), false);
        slots.put(key(1), value(100), false);
        // Key 3 made room for key 1's value; key 2 stays reserved.
        assert!(slots.get(&key(3)).is_none());
        assert!(matches!(slots.get(&key(2)), Some(Slot::Reserved(_))));
        slots.release(&key(2));
        slots.release(&key(1));
        assert!(slots.get(&key(2)).is_none());
        assert!(slots.read(&key(1)).is_some(), "a release leaves a value");
    }

    #[test]
    fn a_value_put_again_replaces_the_old_one_in_the_count() {
        let mut slots = Slots::new(1000);
        slots.put(key(1), value(100), false);
        assert!(!slots.put(key(1), value(300), true), "kept as held");
        assert_eq!(slots.held(), (1, 100));
        assert!(slots.put(key(1), value(300), false));
        assert_eq!(slots.held(), (1, 300));
    }
}
