//! When a store bounded in size scans its directory: the one policy of
//! [`DirectoryStore`](super::DirectoryStore) and
//! [`PackStore`](super::PackStore).
//!
//! # What this module guarantees
//!
//! 1. A store counts the bytes it writes on top of the size its last scan
//!    found (`u64::MAX` before the first, so that the first write scans).
//!    [`Bound::account`] scans when that passes the limit, when a tenth of
//!    the limit was written since the last scan (so that other processes'
//!    writes are seen), or when the caller asks (a pack store starting a
//!    pack).
//! 2. One thread of a store scans at a time ([`Bound::lock`] is held
//!    while scanning); a write while another thread scans is counted by
//!    that scan: what was written while a scan ran stays counted on top of
//!    what it found ([`Bound::scan_started`], [`Bound::scanned`]), and a
//!    scan after which that passes the limit is made again, up to
//!    [`RESCANS`] times.
//! 3. A scan's error is logged, never returned: the write it follows was
//!    made.

use super::{StoreError, directory::Usage};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// How many times a write that scans the directory scans it again while
/// other threads' writes during a scan keep it over its limit.
pub(super) const RESCANS: usize = 8;

/// What a store counts toward its limit between scans (see the
/// [module docs](self)).
#[derive(Debug)]
pub(super) struct Bound {
    /// Bytes in the directory when this store last scanned it, plus what
    /// it wrote since.
    estimated: AtomicU64,
    /// Bytes written since the last scan.
    since_scan: AtomicU64,
    /// Held while scanning.
    scanning: Mutex<()>,
}

impl Bound {
    /// Nothing counted, no scan made yet.
    pub(super) fn new() -> Self {
        Self {
            estimated: AtomicU64::new(u64::MAX),
            since_scan: AtomicU64::new(0),
            scanning: Mutex::new(()),
        }
    }

    /// Held while a scan runs (see 2 above).
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        self.scanning.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a scan notes before it lists the directory: the writes counted
    /// so far, which what it lists holds.
    pub(super) fn scan_started(&self) -> u64 {
        self.since_scan.load(Ordering::Relaxed)
    }

    /// What a scan notes at its end: the directory held `bytes` once it
    /// evicted; `counted`, from [`Bound::scan_started`], are in them, and
    /// what was written since stays counted on top.
    pub(super) fn scanned(&self, counted: u64, bytes: u64) {
        let during = self.since_scan.fetch_sub(counted, Ordering::Relaxed) - counted;
        self.estimated
            .store(bytes.saturating_add(during), Ordering::Relaxed);
    }

    /// Counts `len` bytes written, and scans with `scan` (which calls
    /// [`Bound::scan_started`] and [`Bound::scanned`]) if the limit
    /// `max_bytes` may be passed or `force` (see 1 and 2 above).
    pub(super) fn account(
        &self,
        len: u64,
        force: bool,
        max_bytes: u64,
        dir: &Path,
        scan: impl Fn() -> Result<Usage, StoreError>,
    ) {
        let estimated = self
            .estimated
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                Some(e.saturating_add(len))
            })
            .unwrap_or(u64::MAX)
            .saturating_add(len);
        let since = self.since_scan.fetch_add(len, Ordering::Relaxed) + len;
        if !force && estimated <= max_bytes && since <= max_bytes / 10 {
            return;
        }
        // Another thread of this store is scanning: it counts this write,
        // and scans again if it passes the limit.
        let _scanning = match self.scanning.try_lock() {
            Ok(scanning) => scanning,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        for _ in 0..RESCANS {
            if let Err(e) = scan() {
                log::debug!("code store: eviction in `{}` failed: {e}", dir.display());
                return;
            }
            if self.estimated.load(Ordering::Relaxed) <= max_bytes {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A scan of a directory that holds `bytes` after eviction, counting
    /// its calls in `scans`.
    fn scan<'a>(
        bound: &'a Bound,
        bytes: &'a Cell<u64>,
        scans: &'a Cell<usize>,
    ) -> impl Fn() -> Result<Usage, StoreError> + 'a {
        move || {
            scans.set(scans.get() + 1);
            let counted = bound.scan_started();
            bound.scanned(counted, bytes.get());
            Ok(Usage::default())
        }
    }

    #[test]
    fn a_store_scans_first_then_past_its_limit_a_tenth_or_when_asked() {
        let (bound, bytes, scans) = (Bound::new(), Cell::new(0), Cell::new(0));
        let dir = Path::new("/nowhere");
        // The first write scans: nothing was counted yet.
        bound.account(10, false, 1000, dir, scan(&bound, &bytes, &scans));
        assert_eq!(scans.get(), 1);
        // Under the limit and under a tenth of it since: no scan.
        bound.account(50, false, 1000, dir, scan(&bound, &bytes, &scans));
        assert_eq!(scans.get(), 1);
        // Past a tenth of the limit since the last scan.
        bound.account(60, false, 1000, dir, scan(&bound, &bytes, &scans));
        assert_eq!(scans.get(), 2);
        // Asked (a pack started).
        bound.account(1, true, 1000, dir, scan(&bound, &bytes, &scans));
        assert_eq!(scans.get(), 3);
    }

    #[test]
    fn a_scan_that_leaves_the_store_past_its_limit_is_made_again_a_few_times() {
        let (bound, bytes, scans) = (Bound::new(), Cell::new(5000), Cell::new(0));
        let dir = Path::new("/nowhere");
        bound.account(10, false, 1000, dir, scan(&bound, &bytes, &scans));
        assert_eq!(scans.get(), RESCANS);
        // Evicted down to the limit: one scan.
        bytes.set(900);
        bound.account(10, false, 1000, dir, scan(&bound, &bytes, &scans));
        assert_eq!(scans.get(), RESCANS + 1);
    }

    #[test]
    fn a_write_while_another_thread_scans_is_counted_by_that_scan() {
        let (bound, bytes, scans) = (Bound::new(), Cell::new(0), Cell::new(0));
        let dir = Path::new("/nowhere");
        let counted = {
            let _scanning = bound.lock();
            let counted = bound.scan_started();
            // Another thread's write, past the limit: no scan of its own.
            bound.account(2000, false, 1000, dir, scan(&bound, &bytes, &scans));
            assert_eq!(scans.get(), 0);
            counted
        };
        // The scan ends: the write made while it ran stays counted, so the
        // next write scans.
        bound.scanned(counted, 0);
        bound.account(1, false, 1000, dir, scan(&bound, &bytes, &scans));
        assert_eq!(scans.get(), 1);
    }
}
