//! Writing entries off the compiling thread: a [`Writer`] owns a thread
//! that writes the batches of entries it is sent with [`write()`], so
//! that a cold start does not wait for the store (a file created and
//! renamed per entry, or a round trip to Redis) between compiles.
//!
//! # What this module guarantees
//!
//! 1. **Nothing sent is lost unwritten.** Every batch sent is written, in
//!    the order sent (batches waiting together are joined, whole, into
//!    one [`CodeStore::put_many`], until it holds [`JOIN_ENTRIES`] entries
//!    or more), before [`Writer::wait`] returns and before dropping the
//!    writer returns. A write that fails or panics loses the entries of
//!    that write (every batch joined into it), whose reservations are then
//!    released (see [`write()`]). Should the thread end all the same, a
//!    wait returns, counting what it did not write as failed writes, and
//!    later batches are written on the sender's thread.
//! 2. **Bounded.** At most [`QUEUE_BATCHES`] batches wait to be written;
//!    a sender finding the queue full waits for room, so a store slower
//!    than the compiler slows the compiler down rather than filling memory.
//! 3. **Counted.** [`Writer::wait`] returns how many entries were written
//!    and how many writes failed since the last wait or look
//!    ([`Writer::written_so_far`], which does not wait).
//! 4. Where no thread can be started, batches are written on the sender's
//!    thread, as they were sent: the same outcome, later.

use super::CodeStore;
use super::load::{Unwritten, write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

/// The most batches waiting to be written (see 2 above).
pub const QUEUE_BATCHES: usize = 64;

/// Batches waiting together are joined into one write until it holds this
/// many entries or more (see 1 above).
pub const JOIN_ENTRIES: usize = 256;

/// What was written since the last [`Writer::wait`] or
/// [`Writer::written_so_far`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Entries written.
    pub entries: u64,
    /// Writes that failed (each lost its entries).
    pub errors: u64,
}

/// How far the thread got: batches finished, and their outcome.
#[derive(Default)]
struct Progress {
    finished: u64,
    written: Written,
    /// The thread has ended.
    ended: bool,
}

/// What the writer thread and its owner share.
#[derive(Default)]
struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

/// A thread writing entries to one store (see the [module docs](self)).
pub struct Writer {
    store: Arc<dyn CodeStore>,
    /// `None` once dropping, or where no thread could be started.
    queue: Option<SyncSender<Vec<Unwritten>>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    /// Batches sent to the thread.
    sent: u64,
    /// Written on the sender's thread (see 4 above), since the last wait.
    inline: Written,
}

impl Writer {
    /// A writer of entries to `store`, with a thread of its own if one can
    /// be started.
    pub fn new(store: Arc<dyn CodeStore>) -> Self {
        let shared = Arc::new(Shared::default());
        let (queue, batches) = sync_channel(QUEUE_BATCHES);
        let thread = {
            let (store, shared) = (store.clone(), shared.clone());
            std::thread::Builder::new()
                .name("jitfold-store-writer".into())
                .spawn(move || run(&store, &batches, &shared))
                .ok()
        };
        Self {
            store,
            queue: thread.is_some().then_some(queue),
            thread,
            shared,
            sent: 0,
            inline: Written::default(),
        }
    }

    /// Sends `entries` to be written (see 1 and 2 above).
    pub fn send(&mut self, entries: Vec<Unwritten>) {
        if entries.is_empty() {
            return;
        }
        if self.queue.is_some() && self.lock().ended {
            // Nothing would take it (see 1 above).
            self.queue = None;
        }
        let entries = match &self.queue {
            Some(queue) => match queue.send(entries) {
                Ok(()) => {
                    self.sent += 1;
                    return;
                }
                // The thread has ended (see 1 above).
                Err(unsent) => {
                    self.queue = None;
                    unsent.0
                }
            },
            None => entries,
        };
        add(&mut self.inline, write_caught(&self.store, entries));
    }

    /// What was written since the last wait or look, without waiting:
    /// the batches the thread has finished so far (see 3 above).
    pub fn written_so_far(&mut self) -> Written {
        self.look(false)
    }

    /// Waits until every batch sent is written, and returns what was
    /// written since the last wait or look (see 3 above).
    pub fn wait(&mut self) -> Written {
        self.look(true)
    }

    /// What was written since the last wait or look, once every batch
    /// sent is written if `wait`.
    fn look(&mut self, wait: bool) -> Written {
        let mut progress = self
            .shared
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while wait && progress.finished < self.sent && !progress.ended {
            progress = self
                .shared
                .changed
                .wait(progress)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if wait && progress.finished < self.sent {
            // The thread ended with batches unwritten (see 1 above).
            progress.written.errors += self.sent - progress.finished;
            progress.finished = self.sent;
        }
        let mut written = std::mem::take(&mut progress.written);
        add(&mut written, std::mem::take(&mut self.inline));
        written
    }
}

impl Writer {
    /// The thread's progress, locked.
    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.shared
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The thread writes what is queued, then ends (see 1 above).
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer thread: writes each batch received, joined with those
/// waiting behind it, until the owner hangs up.
fn run(store: &Arc<dyn CodeStore>, batches: &Receiver<Vec<Unwritten>>, shared: &Shared) {
    // However the thread ends, a wait for it does not last for ever.
    struct Ended<'a>(&'a Shared);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            let mut progress = self
                .0
                .progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            progress.ended = true;
            drop(progress);
            self.0.changed.notify_all();
        }
    }
    let _ended = Ended(shared);
    while let Ok(mut entries) = batches.recv() {
        let mut received = 1;
        while entries.len() < JOIN_ENTRIES {
            match batches.try_recv() {
                Ok(more) => {
                    entries.extend(more);
                    received += 1;
                }
                Err(_) => break,
            }
        }
        let outcome = write_caught(store, entries);
        let mut progress = shared
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        progress.finished += received;
        add(&mut progress.written, outcome);
        drop(progress);
        shared.changed.notify_all();
    }
}

/// Writes `entries` with [`write()`]; a store that fails or panics is one
/// error, logged, and loses at most these entries (none counted as
/// written, though a `put_many` that fails on one entry may have stored
/// the others).
fn write_caught(store: &Arc<dyn CodeStore>, entries: Vec<Unwritten>) -> Written {
    let count = entries.len();
    let outcome = catch_unwind(AssertUnwindSafe(|| write(store, entries)));
    match outcome {
        Ok(Ok(written)) => Written {
            entries: written as u64,
            errors: 0,
        },
        Ok(Err(e)) => {
            log::warn!("code store: {e}; {count} entries not all stored");
            Written {
                entries: 0,
                errors: 1,
            }
        }
        Err(panic) => {
            log::warn!(
                "code store: panicked writing {count} entries: {}",
                crate::compile::panic_message(&panic)
            );
            Written {
                entries: 0,
                errors: 1,
            }
        }
    }
}

/// Adds `more` to `total`.
fn add(total: &mut Written, more: Written) {
    total.entries += more.entries;
    total.errors += more.errors;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::load::{Claimed, claim};
    use crate::store::{MemoryStore, StoreError, StoreKey};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A memory store whose writes wait for a gate, and then fail or panic
    /// if told to; it counts its writes and releases.
    #[derive(Default)]
    struct Gated {
        values: MemoryStore,
        open: Mutex<bool>,
        opened: Condvar,
        fail: AtomicBool,
        panic: AtomicBool,
        /// Panics with a payload whose drop panics too, which ends the
        /// writer thread.
        bomb: AtomicBool,
        writes: AtomicUsize,
        releases: AtomicUsize,
    }

    impl Gated {
        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    impl CodeStore for Gated {
        fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
            self.values.get(key)
        }

        fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
            self.put_many(&[(*key, value.to_vec())])
        }

        fn put_many(&self, entries: &[(StoreKey, Vec<u8>)]) -> Result<(), StoreError> {
            {
                let mut open = self.open.lock().unwrap();
                while !*open {
                    open = self.opened.wait(open).unwrap();
                }
            }
            self.writes.fetch_add(1, Ordering::SeqCst);
            assert!(!self.panic.load(Ordering::SeqCst), "a store panics");
            if self.bomb.load(Ordering::SeqCst) {
                std::panic::panic_any(Bomb);
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::TooLarge { len: 1, limit: 0 });
            }
            self.values.put_many(entries)
        }

        fn reserves(&self) -> bool {
            true
        }

        fn release(&self, _: &StoreKey) {
            self.releases.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A panic payload whose drop panics.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's drop panics");
        }
    }

    fn key(n: u8) -> StoreKey {
        StoreKey::from_bytes([n; 16])
    }

    /// Entry `n`, holding the reservation of its key.
    fn entry(store: &Arc<dyn CodeStore>, n: u8) -> Unwritten {
        let Ok(Claimed::Reserved(reservation)) = claim(store, key(n)) else {
            panic!("a key the store does not hold is the caller's");
        };
        Unwritten {
            key: key(n),
            value: vec![n; 8],
            reservation: Some(reservation),
        }
    }

    fn written(entries: u64, errors: u64) -> Written {
        Written { entries, errors }
    }

    /// Sends one batch and waits for it.
    fn write(writer: &mut Writer, batch: Vec<Unwritten>) -> Written {
        writer.send(batch);
        writer.wait()
    }

    fn gated() -> (Arc<Gated>, Arc<dyn CodeStore>) {
        let gated = Arc::new(Gated::default());
        let store: Arc<dyn CodeStore> = gated.clone();
        (gated, store)
    }

    #[test]
    fn batches_waiting_together_are_one_write_and_all_are_written_by_wait() {
        let (gated, store) = gated();
        let mut writer = Writer::new(store.clone());
        for n in 0..10 {
            writer.send(vec![entry(&store, n)]);
        }
        // The sender did not wait for the store.
        assert_eq!(gated.writes.load(Ordering::SeqCst), 0);
        gated.open();
        assert_eq!(writer.wait(), written(10, 0));
        for n in 0..10 {
            assert_eq!(store.get(&key(n)).unwrap(), Some(vec![n; 8]));
        }
        // Joined: the batches waiting behind the one taken first (one
        // write, or two if the thread took the first before the rest were
        // sent).
        assert!((1..=2).contains(&gated.writes.load(Ordering::SeqCst)));
        assert_eq!(gated.releases.load(Ordering::SeqCst), 0);
        // Counted once.
        assert_eq!(writer.wait(), Written::default());
    }

    /// A look counts the batches finished so far without waiting for
    /// the rest; a wait then counts only what the look did not.
    #[test]
    fn a_look_counts_what_is_written_so_far_and_waits_for_nothing() {
        let (gated, store) = gated();
        let mut writer = Writer::new(store.clone());
        writer.send(vec![entry(&store, 1)]);
        // Held at the gate: nothing is written yet.
        assert_eq!(writer.written_so_far(), Written::default());
        gated.open();
        // Once written, the thread counts it: looked at until it has (for
        // at most ten seconds).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut looked = writer.written_so_far();
        while looked == Written::default() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            looked = writer.written_so_far();
        }
        assert_eq!(looked, written(1, 0));
        writer.send(vec![entry(&store, 2)]);
        assert_eq!(writer.wait(), written(1, 0));
        assert_eq!(writer.written_so_far(), Written::default());
    }

    #[test]
    fn a_write_that_fails_or_panics_loses_its_entries_and_releases_their_keys() {
        let (gated, store) = gated();
        gated.open();
        let mut writer = Writer::new(store.clone());
        gated.fail.store(true, Ordering::SeqCst);
        assert_eq!(
            write(&mut writer, vec![entry(&store, 1), entry(&store, 2)]),
            written(0, 1)
        );
        assert_eq!(gated.releases.load(Ordering::SeqCst), 2);
        gated.fail.store(false, Ordering::SeqCst);
        gated.panic.store(true, Ordering::SeqCst);
        assert_eq!(write(&mut writer, vec![entry(&store, 3)]), written(0, 1));
        assert_eq!(gated.releases.load(Ordering::SeqCst), 3);
        // The thread goes on.
        gated.panic.store(false, Ordering::SeqCst);
        assert_eq!(write(&mut writer, vec![entry(&store, 4)]), written(1, 0));
        assert_eq!(store.get(&key(4)).unwrap(), Some(vec![4; 8]));
        assert_eq!(store.get(&key(1)).unwrap(), None);
    }

    /// Should the thread end (here: a panic while dropping a store's panic
    /// payload), a wait still returns, counting the batch it lost, and
    /// later batches are written on the sender's thread.
    #[test]
    fn a_wait_returns_after_the_thread_ended() {
        let (gated, store) = gated();
        gated.open();
        gated.bomb.store(true, Ordering::SeqCst);
        let mut writer = Writer::new(store.clone());
        assert_eq!(write(&mut writer, vec![entry(&store, 1)]), written(0, 1));
        assert_eq!(gated.releases.load(Ordering::SeqCst), 1);
        gated.bomb.store(false, Ordering::SeqCst);
        assert_eq!(write(&mut writer, vec![entry(&store, 2)]), written(1, 0));
        assert_eq!(store.get(&key(2)).unwrap(), Some(vec![2; 8]));
    }

    #[test]
    fn dropping_the_writer_writes_what_is_queued() {
        let (gated, store) = gated();
        let mut writer = Writer::new(store.clone());
        for n in 0..3 {
            writer.send(vec![entry(&store, n)]);
        }
        let opener = {
            let gated = gated.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                gated.open();
            })
        };
        drop(writer);
        for n in 0..3 {
            assert_eq!(store.get(&key(n)).unwrap(), Some(vec![n; 8]));
        }
        opener.join().unwrap();
    }
}
