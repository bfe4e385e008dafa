//! Pieces of pack files that a [`PackStore`](super::PackStore) read while
//! indexing them, kept in memory so that the `get`s that follow (a warm
//! start reads most of what it indexed, in the order it was written) copy
//! a record from memory instead of reading it from the pack again.
//!
//! # What this module guarantees
//!
//! 1. **The bytes of the pack.** A piece is a copy of whole records a
//!    scan read from a pack at an offset and checked, and is never written
//!    to. Records in a pack are only ever appended, never rewritten in
//!    place, so a piece holds what the pack holds at those offsets for as
//!    long as the pack is indexed (the store checks that a record it
//!    takes from a piece is the one its index names, and need not hash it
//!    again). A record read twice counts twice: the piece is then dropped
//!    early, and the file read instead.
//! 2. **Bounded.** At most [`KEPT_BYTES`] in all: a piece that would pass
//!    it is not kept (a warm start reads records in the order they were
//!    written, and packs are scanned oldest first).
//! 3. **Not held for long.** A piece is dropped once as many bytes of
//!    records were read from it as it holds whole records of (each record
//!    is expected to be read once), when its pack is closed, or once it is
//!    older than [`KEEP_FOR`], at the next [`Kept::drop_spent`] (which the
//!    store calls at a `get` and when it looks at its directory).
//! 4. A record is copied from a piece only if it lies wholly within it;
//!    otherwise [`Kept::read`] is `None` and the caller reads the file.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The most bytes of pieces a store keeps: 16 MiB (two packs' worth).
pub const KEPT_BYTES: usize = 16 << 20;

/// A kept piece of a pack is dropped at the store's first `get` (or look
/// at its directory) after it has been kept this long (10 seconds), read
/// or not.
pub const KEEP_FOR: Duration = Duration::from_secs(10);

/// The pieces a store keeps, oldest first.
#[derive(Debug, Default)]
pub(super) struct Kept {
    pieces: VecDeque<Piece>,
    bytes: usize,
}

/// What a scan read of one pack at one offset.
#[derive(Debug)]
struct Piece {
    pack: u32,
    at: u64,
    bytes: Vec<u8>,
    /// Bytes of the whole records in it not read from it yet.
    unread: AtomicU64,
    kept_at: Instant,
}

impl Piece {
    fn spent(&self, now: Instant) -> bool {
        self.unread.load(Ordering::Relaxed) == 0 || now.duration_since(self.kept_at) >= KEEP_FOR
    }
}

impl Kept {
    /// Keeps `bytes`, read from pack `pack` at offset `at`, which hold
    /// whole records of `records` bytes in all (headers included); nothing
    /// if they hold none, or if the pieces kept would pass [`KEPT_BYTES`].
    pub(super) fn keep(&mut self, pack: u32, at: u64, bytes: Vec<u8>, records: u64) {
        if records == 0 || self.bytes + bytes.len() > KEPT_BYTES {
            return;
        }
        // A read from a piece checks only a record's key and length (its
        // hash was checked when the piece was scanned), which holds only
        // if every index entry into a piece starts one of its records: so
        // the scans of a pack cover ranges apart (each starts where the
        // last indexed ended), and no two pieces overlap.
        let end = at + bytes.len() as u64;
        debug_assert!(
            self.pieces
                .iter()
                .all(|p| p.pack != pack || end <= p.at || p.at + p.bytes.len() as u64 <= at),
            "a piece kept over another of pack {pack}"
        );
        self.bytes += bytes.len();
        self.pieces.push_back(Piece {
            pack,
            at,
            bytes,
            unread: AtomicU64::new(records),
            kept_at: Instant::now(),
        });
    }

    /// What `read` makes of the `len` bytes of pack `pack` at offset
    /// `at`, if a piece holds them all, counted as read from it; and
    /// whether a piece is now due to be dropped (see [`Kept::drop_spent`]).
    pub(super) fn read<R>(
        &self,
        pack: u32,
        at: u64,
        len: usize,
        read: impl FnOnce(&[u8]) -> R,
    ) -> (Option<R>, bool) {
        let now = Instant::now();
        let oldest_due = self.pieces.front().is_some_and(|p| p.spent(now));
        let piece = self.pieces.iter().rev().find(|p| {
            p.pack == pack && at >= p.at && at + len as u64 <= p.at + p.bytes.len() as u64
        });
        let Some(piece) = piece else {
            return (None, oldest_due);
        };
        let start = (at - piece.at) as usize;
        let made = read(&piece.bytes[start..start + len]);
        let len = len as u64;
        let unread = piece
            .unread
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |unread| {
                Some(unread.saturating_sub(len))
            })
            .unwrap_or_else(|unread| unread);
        (Some(made), oldest_due || unread <= len)
    }

    /// Drops the spent pieces (see 3 in the module docs).
    pub(super) fn drop_spent(&mut self) {
        let now = Instant::now();
        self.pieces.retain(|p| !p.spent(now));
        self.bytes = self.pieces.iter().map(|p| p.bytes.len()).sum();
    }

    /// Drops the pieces of pack `pack` (closed).
    pub(super) fn drop_pack(&mut self, pack: u32) {
        self.pieces.retain(|p| p.pack != pack);
        self.bytes = self.pieces.iter().map(|p| p.bytes.len()).sum();
    }

    /// The bytes kept.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::{KEPT_BYTES, Kept};

    /// Bytes 0, 1, 2, ... of a piece `len` long.
    fn counting(len: usize) -> Vec<u8> {
        (0..len).map(|i| i as u8).collect()
    }

    /// Pieces of one pack never overlap (see `Kept::keep`): pieces of
    /// other packs and pieces end to end are kept...
    #[test]
    fn pieces_end_to_end_or_of_other_packs_are_kept() {
        let mut kept = Kept::default();
        kept.keep(3, 100, counting(50), 50);
        kept.keep(4, 120, counting(50), 50);
        kept.keep(3, 150, counting(10), 10);
        kept.keep(3, 90, counting(10), 10);
        assert_eq!(kept.pieces.len(), 4);
    }

    /// ...and debug builds stop at one over another.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "a piece kept over another of pack 3")]
    fn a_piece_over_another_of_its_pack_is_a_bug() {
        let mut kept = Kept::default();
        kept.keep(3, 100, counting(50), 50);
        kept.keep(3, 149, counting(10), 10);
    }

    #[test]
    fn a_record_wholly_in_a_piece_is_copied_from_it_and_others_are_not() {
        let mut kept = Kept::default();
        kept.keep(3, 100, counting(50), 50);
        assert_eq!(
            kept.read(3, 110, 5, <[u8]>::to_vec).0,
            Some(vec![10, 11, 12, 13, 14])
        );
        assert_eq!(
            kept.read(3, 100, 50, <[u8]>::to_vec).0.map(|b| b.len()),
            Some(50)
        );
        // Past its end, before its start, another pack.
        assert_eq!(kept.read(3, 140, 11, <[u8]>::to_vec).0, None);
        assert_eq!(kept.read(3, 99, 2, <[u8]>::to_vec).0, None);
        assert_eq!(kept.read(4, 110, 5, <[u8]>::to_vec).0, None);
    }

    #[test]
    fn a_piece_whose_records_were_all_read_is_dropped() {
        let mut kept = Kept::default();
        kept.keep(0, 0, counting(100), 60);
        kept.keep(0, 100, counting(100), 100);
        assert!(!kept.read(0, 0, 40, <[u8]>::to_vec).1);
        let (copied, due) = kept.read(0, 40, 20, <[u8]>::to_vec);
        assert!(copied.is_some() && due, "60 bytes of records read: spent");
        kept.drop_spent();
        assert_eq!(kept.read(0, 0, 40, <[u8]>::to_vec).0, None);
        assert_eq!(
            kept.read(0, 100, 40, <[u8]>::to_vec).0.map(|b| b[0]),
            Some(0)
        );
        assert_eq!(kept.bytes(), 100);
    }

    #[test]
    fn pieces_past_the_bound_are_not_kept_nor_any_without_records() {
        let mut kept = Kept::default();
        let piece = KEPT_BYTES / 4;
        for i in 0..6u64 {
            kept.keep(0, i * piece as u64, counting(piece), 1);
        }
        kept.keep(1, 0, counting(10), 0);
        assert_eq!(kept.bytes(), KEPT_BYTES);
        assert!(
            kept.read(0, 3 * piece as u64, 1, <[u8]>::to_vec)
                .0
                .is_some()
        );
        assert_eq!(
            kept.read(0, 4 * piece as u64, 1, <[u8]>::to_vec).0,
            None,
            "the fifth was not kept"
        );
        assert_eq!(
            kept.read(1, 0, 1, <[u8]>::to_vec).0,
            None,
            "no records, not kept"
        );
        kept.drop_pack(0);
        assert_eq!(kept.bytes(), 0);
    }
}
