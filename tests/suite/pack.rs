//! The pack store: values round-trip within a store and across stores on
//! one directory; planted files, links, torn and changed records cost at
//! most a miss or an error, never part of a value; threads and processes
//! share it (a writer killed mid-way too); it stays bounded, evicting the
//! least recently used packs.

use super::store::{
    TempDir, check_value, child, key, modified, set_time, share_with_children, threads_share, value,
};
use jitfold::store::pack::{MAX_PACKS, PACK_MAGIC, REFRESH_AFTER};
use jitfold::store::{CodeStore, PackStore, StoreError};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The packs in `dir`, in the order this process created them (by the
/// count that ends their names).
fn packs(dir: &Path) -> Vec<PathBuf> {
    let mut packs: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("pack-")
        })
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_owned();
            let count = name.rsplit('-').next().unwrap().parse().unwrap_or(u64::MAX);
            (count, p)
        })
        .collect();
    packs.sort();
    packs.into_iter().map(|(_, p)| p).collect()
}

#[test]
fn values_round_trip_within_a_store_and_across_stores() {
    let dir = TempDir::new("pack-round-trip");
    let store = PackStore::new(dir.path().join("nested/store")).unwrap();
    assert_eq!(store.get(&key(1)).unwrap(), None);
    store.put(&key(1), b"one").unwrap();
    store
        .put_many(&[(key(1), b"uno".to_vec()), (key(2), Vec::new())])
        .unwrap();
    assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"uno"[..]));
    assert_eq!(store.get(&key(2)).unwrap().as_deref(), Some(&b""[..]));
    // Both writes went to one pack.
    assert_eq!(packs(store.dir()).len(), 1);
    // A second store on the directory finds them (at its first get).
    let again = PackStore::new(store.dir()).unwrap();
    assert_eq!(
        again.get_many(&[key(1), key(2), key(3)]).unwrap(),
        [Some(b"uno".to_vec()), Some(Vec::new()), None]
    );
    assert_eq!(again.indexed(), 2);
    // What the first writes later, the second sees at a miss once
    // `REFRESH_AFTER` has passed since it last looked.
    store.put(&key(3), b"three").unwrap();
    std::thread::sleep(REFRESH_AFTER);
    assert_eq!(again.get(&key(3)).unwrap().as_deref(), Some(&b"three"[..]));
    // A value larger than the store keeps is an error and not stored; the
    // rest of the batch is.
    let small = PackStore::new(store.dir()).unwrap().with_limit(1000);
    let error = small
        .put_many(&[(key(4), vec![0; 801]), (key(5), b"five".to_vec())])
        .unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::TooLarge {
                len: 801,
                limit: 800
            }
        ),
        "{error}"
    );
    assert_eq!(small.get(&key(4)).unwrap(), None);
    assert_eq!(small.get(&key(5)).unwrap().as_deref(), Some(&b"five"[..]));
}

/// A pack cut short (a writer killed mid-record, or a record still being
/// written) is read up to its last whole record, and the rest once it is
/// whole; a record changed after it was indexed is a miss, not a value,
/// and a put mends it.
#[test]
fn a_partial_or_changed_record_is_never_part_of_a_value() {
    let dir = TempDir::new("pack-torn");
    let writer = PackStore::new(dir.path()).unwrap();
    writer.put(&key(1), &value(1, 0, 500)).unwrap();
    writer.put(&key(2), &value(2, 0, 500)).unwrap();
    let [pack] = &packs(dir.path())[..] else {
        panic!("one pack")
    };
    let whole = std::fs::read(pack).unwrap();
    // Cut inside the second record's value.
    let file = std::fs::File::options().write(true).open(pack).unwrap();
    file.set_len(whole.len() as u64 - 100).unwrap();
    let reader = PackStore::new(dir.path()).unwrap();
    check_value(1, &reader.get(&key(1)).unwrap().unwrap()).unwrap();
    assert_eq!(reader.get(&key(2)).unwrap(), None);
    // Written to the end: found at a later look.
    std::fs::write(pack, &whole).unwrap();
    std::thread::sleep(REFRESH_AFTER);
    check_value(2, &reader.get(&key(2)).unwrap().unwrap()).unwrap();
    // A byte of the first value flipped in place: a miss.
    let mut changed = whole.clone();
    changed[PACK_MAGIC.len() + 28 + 100] ^= 1;
    std::fs::write(pack, &changed).unwrap();
    assert_eq!(reader.get(&key(1)).unwrap(), None);
    let [second, first] = &reader.get_many(&[key(2), key(1)]).unwrap()[..] else {
        panic!("two values")
    };
    check_value(2, second.as_ref().unwrap()).unwrap();
    assert_eq!(*first, None);
    // A new reader does not index it (nor what follows it).
    let fresh = PackStore::new(dir.path()).unwrap();
    assert_eq!(fresh.get_many(&[key(1), key(2)]).unwrap(), [None, None]);
    // A put writes it again, readable by all.
    fresh.put(&key(1), &value(1, 1, 700)).unwrap();
    check_value(1, &fresh.get(&key(1)).unwrap().unwrap()).unwrap();
    std::thread::sleep(REFRESH_AFTER);
    check_value(
        1,
        &PackStore::new(dir.path())
            .unwrap()
            .get(&key(1))
            .unwrap()
            .unwrap(),
    )
    .unwrap();
}

/// What a store read to index a pack serves its first read of each record
/// (the pack's bytes as they were: records are never rewritten in place);
/// a record read once is read from the file after, and so is one a new
/// store indexes.
#[test]
fn a_record_indexed_is_read_from_the_file_once_and_from_memory_first() {
    let dir = TempDir::new("pack-kept");
    let writer = PackStore::new(dir.path()).unwrap();
    writer
        .put_many(&[(key(1), value(1, 0, 500)), (key(2), value(2, 0, 700))])
        .unwrap();
    let [pack] = &packs(dir.path())[..] else {
        panic!("one pack")
    };
    let reader = PackStore::new(dir.path()).unwrap();
    assert_eq!(reader.get(&key(3)).unwrap(), None, "indexed now");
    // Every byte after the magic flipped in place, the pack's length the
    // same.
    let whole = std::fs::read(pack).unwrap();
    let flipped: Vec<u8> = whole.iter().map(|b| !b).collect();
    std::fs::write(
        pack,
        [&whole[..PACK_MAGIC.len()], &flipped[PACK_MAGIC.len()..]].concat(),
    )
    .unwrap();
    check_value(1, &reader.get(&key(1)).unwrap().unwrap()).unwrap();
    check_value(2, &reader.get(&key(2)).unwrap().unwrap()).unwrap();
    // Both read once: the piece is dropped, and the file is read.
    assert_eq!(reader.get(&key(1)).unwrap(), None);
    assert_eq!(reader.get(&key(2)).unwrap(), None);
    assert_eq!(
        PackStore::new(dir.path()).unwrap().get(&key(1)).unwrap(),
        None
    );
}

/// A scan that found a record not whole yet keeps none of its bytes: once
/// the record is whole and the pack has grown, it is read whole, as often
/// as asked, though the scan that indexed it read the pack where the old
/// scan stopped.
#[test]
fn a_record_not_whole_when_first_scanned_is_read_whole_later() {
    let dir = TempDir::new("pack-kept-stale");
    let writer = PackStore::new(dir.path()).unwrap();
    writer
        .put_many(&[(key(1), value(1, 0, 100)), (key(2), value(2, 0, 100))])
        .unwrap();
    let [pack] = &packs(dir.path())[..] else {
        panic!("one pack")
    };
    let whole = std::fs::read(pack).unwrap();
    // The second record's value not written yet (zeros).
    let second = PACK_MAGIC.len() + 28 + 100 + 28;
    let mut torn = whole.clone();
    torn[second..second + 100].fill(0);
    std::fs::write(pack, &torn).unwrap();
    let reader = PackStore::new(dir.path()).unwrap();
    assert_eq!(reader.get(&key(9)).unwrap(), None);
    assert_eq!(reader.indexed(), 1);
    // Whole now, and the pack grows.
    std::fs::write(pack, &whole).unwrap();
    writer.put(&key(3), &value(3, 0, 100)).unwrap();
    std::thread::sleep(REFRESH_AFTER);
    assert_eq!(reader.get(&key(9)).unwrap(), None);
    for id in [2, 3, 2, 1, 2, 3, 1] {
        check_value(id, &reader.get(&key(id)).unwrap().unwrap()).unwrap();
    }
}

/// A key written to several packs: a store reads its own last write, and
/// a store that wrote none of them the record of the newest pack.
#[test]
fn a_store_reads_its_own_write_else_the_newest() {
    let dir = TempDir::new("pack-order");
    let (a, b) = (
        PackStore::new(dir.path()).unwrap(),
        PackStore::new(dir.path()).unwrap(),
    );
    b.put(&key(1), &value(1, 2, 100)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    a.put(&key(1), &value(1, 1, 100)).unwrap();
    // `b` looks at the directory (at a miss) and finds `a`'s newer pack.
    std::thread::sleep(REFRESH_AFTER);
    assert_eq!(b.get(&key(9)).unwrap(), None);
    assert_eq!(b.get(&key(1)).unwrap(), Some(value(1, 2, 100)));
    let fresh = PackStore::new(dir.path()).unwrap();
    assert_eq!(fresh.get(&key(1)).unwrap(), Some(value(1, 1, 100)));
}

/// A store whose pack another evicts writes its next entries to a new
/// pack, and reads them.
#[test]
fn a_store_whose_pack_was_evicted_starts_another() {
    let dir = TempDir::new("pack-evicted");
    let store = PackStore::new(dir.path()).unwrap();
    store.put(&key(1), &value(1, 0, 100)).unwrap();
    let evictor = PackStore::new(dir.path()).unwrap().with_limit(1);
    assert_eq!(evictor.trim().unwrap().entries, 0);
    // Still open here, until the store looks again.
    check_value(1, &store.get(&key(1)).unwrap().unwrap()).unwrap();
    // It looks again at a miss: the pack is gone, and so is its entry.
    std::thread::sleep(REFRESH_AFTER);
    assert_eq!(store.get(&key(9)).unwrap(), None);
    assert_eq!(store.get(&key(1)).unwrap(), None);
    store.put(&key(2), &value(2, 0, 100)).unwrap();
    check_value(2, &store.get(&key(2)).unwrap().unwrap()).unwrap();
    assert_eq!(packs(dir.path()).len(), 1);
    let fresh = PackStore::new(dir.path()).unwrap();
    check_value(2, &fresh.get(&key(2)).unwrap().unwrap()).unwrap();
}

/// Files planted under pack names (a FIFO, a link to a device, a sparse
/// file longer than any pack, one that is no pack) are misses at once, not
/// hangs nor memory without bound; a link to a real pack outside is not
/// followed, and its target is neither read nor touched; eviction deletes
/// the planted files in the directory, never what a link points to.
#[cfg(unix)]
#[test]
fn a_planted_file_costs_at_most_a_miss() {
    use jitfold::store::pack::MAX_PACK_BYTES;
    let dir = TempDir::new("pack-planted");
    let outside = TempDir::new("pack-planted-target");
    let elsewhere = PackStore::new(outside.path()).unwrap();
    elsewhere.put(&key(1), &value(1, 0, 100)).unwrap();
    let [target] = &packs(outside.path())[..] else {
        panic!("one pack")
    };
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    set_time(target, old);
    std::fs::create_dir_all(dir.path()).unwrap();
    let status = Command::new("mkfifo")
        .arg(dir.path().join("pack-fifo"))
        .status()
        .unwrap();
    assert!(status.success());
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("pack-zero")).unwrap();
    std::os::unix::fs::symlink(target, dir.path().join("pack-link")).unwrap();
    let long = std::fs::File::create(dir.path().join("pack-long")).unwrap();
    long.set_len(MAX_PACK_BYTES + 1).unwrap();
    std::fs::write(dir.path().join("pack-junk"), [7u8; 4096]).unwrap();
    let store = Arc::new(PackStore::new(dir.path()).unwrap());
    let (sender, receiver) = std::sync::mpsc::channel();
    let reader = store.clone();
    std::thread::spawn(move || {
        let _ = sender.send(reader.get(&key(1)).map(|v| v.map(|v| v.len())));
    });
    let got = receiver
        .recv_timeout(Duration::from_secs(10))
        .expect("get hangs");
    assert_eq!(got.unwrap(), None);
    assert_eq!(store.indexed(), 0);
    assert_eq!(modified(target), old);
    store.put(&key(1), b"entry").unwrap();
    assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"entry"[..]));
    // Evicting everything but its own pack: the planted regular files and
    // links go; the link's target stays.
    let tiny = PackStore::new(dir.path()).unwrap().with_limit(1);
    tiny.trim().unwrap();
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!left.contains(&"pack-junk".to_owned()), "{left:?}");
    assert!(!left.contains(&"pack-long".to_owned()), "{left:?}");
    assert!(target.exists());
    assert_eq!(modified(target), old);
}

/// `get_many` reads at most `GET_MANY_BYTES` in all: entries adding up to
/// more make it fail before it reads the one that would pass the bound,
/// while each is still read on its own.
#[test]
fn get_many_holds_a_bounded_number_of_bytes() {
    use jitfold::store::directory::{GET_MANY_BYTES, MAX_ENTRY_BYTES};
    let dir = TempDir::new("pack-budget");
    let store = PackStore::new(dir.path()).unwrap();
    let big = MAX_ENTRY_BYTES as usize - 64;
    let n = (GET_MANY_BYTES / big as u64 + 1) as u32;
    let entries: Vec<_> = (0..n).map(|i| (key(i), value(i, 0, big - 28))).collect();
    store.put_many(&entries).unwrap();
    let keys: Vec<_> = (0..n).map(key).collect();
    let error = store.get_many(&keys).unwrap_err();
    assert!(matches!(error, StoreError::TooLarge { .. }), "{error}");
    for i in 0..n {
        check_value(i, &store.get(&key(i)).unwrap().unwrap()).unwrap();
    }
    let long = vec![0u8; MAX_ENTRY_BYTES as usize + 1];
    assert!(matches!(
        store.put(&key(0), &long),
        Err(StoreError::TooLarge { .. })
    ));
}

/// Threads writing the same and different keys while others read, on one
/// store and on stores of their own: every read is a whole value of its
/// key, and the last writes are there.
#[test]
fn concurrent_threads_never_see_a_torn_entry() {
    let dir = TempDir::new("pack-threads");
    let shared = Arc::new(PackStore::new(dir.path()).unwrap());
    let store_of = |t: u32| -> Arc<dyn CodeStore> {
        if t.is_multiple_of(2) {
            shared.clone()
        } else {
            Arc::new(PackStore::new(dir.path()).unwrap())
        }
    };
    threads_share(store_of, &*shared);
    // One pack per store.
    assert_eq!(packs(dir.path()).len(), 4);
}

#[test]
fn several_processes_share_a_directory_without_torn_entries() {
    let dir = TempDir::new("pack-processes");
    let store = PackStore::new(dir.path()).unwrap();
    share_with_children(dir.path(), true, &store);
    let after = PackStore::new(dir.path()).unwrap();
    for id in 0..4 {
        check_value(id, &after.get(&key(id)).unwrap().unwrap()).unwrap();
    }
    assert_eq!(after.indexed(), 4);
}

/// A writer killed at an arbitrary point leaves no torn entry: every
/// record indexed is whole, and a store on the directory goes on writing.
#[test]
fn a_killed_writer_leaves_no_torn_entry() {
    let dir = TempDir::new("pack-killed");
    std::fs::create_dir_all(dir.path()).unwrap();
    for round in 0..3 {
        let mut writer = child(dir.path(), 10 + round, true, true);
        let mut polls = 0;
        while PackStore::new(dir.path())
            .unwrap()
            .get_many(&[key(0), key(1), key(2), key(3)])
            .unwrap()
            .iter()
            .any(Option::is_none)
        {
            assert!(polls < 2000, "the writer wrote nothing");
            std::thread::sleep(Duration::from_millis(5));
            polls += 1;
        }
        std::thread::sleep(Duration::from_millis(7 * round));
        writer.kill().unwrap();
        writer.wait().unwrap();
        let store = PackStore::new(dir.path()).unwrap();
        for id in 0..4 {
            check_value(id, &store.get(&key(id)).unwrap().unwrap()).unwrap();
        }
        store.put(&key(9), &value(9, round, 100)).unwrap();
        check_value(9, &store.get(&key(9)).unwrap().unwrap()).unwrap();
    }
}

/// Over its limit, the store deletes the least recently used packs (a
/// `get` counts as a use of its pack, if it was last set over
/// `TOUCH_AFTER` ago) until it is at most the low-water mark; never its
/// own current pack; files that are not packs stay.
#[test]
fn eviction_keeps_the_bound_in_lru_order() {
    use jitfold::store::directory::TOUCH_AFTER;
    let dir = TempDir::new("pack-evict");
    // A pack per entry: packs hold at most a tenth of the limit.
    let store = PackStore::new(dir.path()).unwrap().with_limit(10_000);
    assert_eq!(store.pack_bytes(), 1000);
    for id in 0..10 {
        store.put(&key(id), &value(id, 0, 878)).unwrap();
    }
    let made = packs(dir.path());
    assert_eq!(made.len(), 10);
    assert_eq!(store.usage().unwrap().bytes, 9_500);
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for (id, pack) in made.iter().enumerate() {
        set_time(pack, hour_ago + Duration::from_secs(id as u64));
    }
    // A reader that finds them old sets their time when it reads them.
    let reader = PackStore::new(dir.path()).unwrap().with_limit(10_000);
    reader.get(&key(0)).unwrap().unwrap();
    reader.get(&key(2)).unwrap().unwrap();
    let recent = SystemTime::now() - TOUCH_AFTER / 2;
    assert!(modified(&made[0]) > recent);
    // One found recently used keeps its time.
    set_time(&made[9], recent);
    let third = PackStore::new(dir.path()).unwrap();
    third.get(&key(9)).unwrap().unwrap();
    assert_eq!(modified(&made[9]), recent);
    std::fs::write(dir.path().join("README"), [0; 5000]).unwrap();
    // 10 packs of 950 bytes and one more: over 10 000, down to 8 000, the
    // oldest first (1, 3 and 4).
    store.put(&key(10), &value(10, 0, 878)).unwrap();
    let usage = store.usage().unwrap();
    assert_eq!((usage.entries, usage.bytes), (8, 8 * 950), "{usage:?}");
    std::thread::sleep(REFRESH_AFTER);
    let fresh = PackStore::new(dir.path()).unwrap();
    let present: Vec<u32> = (0..=10)
        .filter(|id| fresh.get(&key(*id)).unwrap().is_some())
        .collect();
    assert_eq!(present, [0, 2, 5, 6, 7, 8, 9, 10]);
    assert!(dir.path().join("README").exists());
}

/// However many stores write one entry each, the directory holds at most
/// `MAX_PACKS` packs after each write (the store evicts when it starts a
/// pack), and the most recent entries are there.
#[test]
fn the_number_of_packs_is_bounded() {
    let dir = TempDir::new("pack-count");
    for id in 0..(MAX_PACKS as u32 + 20) {
        let store = PackStore::new(dir.path()).unwrap();
        store.put(&key(id), &value(id, 0, 50)).unwrap();
        assert!(packs(dir.path()).len() <= MAX_PACKS);
    }
    let store = PackStore::new(dir.path()).unwrap();
    let last = MAX_PACKS as u32 + 19;
    check_value(last, &store.get(&key(last)).unwrap().unwrap()).unwrap();
    assert_eq!(store.get(&key(0)).unwrap(), None);
}

/// A store that only writes closes the packs its eviction deletes, so
/// that their space is freed and it holds no more files open than the
/// directory lists, however much it writes; its index holds only what the
/// packs left in the directory hold.
#[test]
fn a_store_that_only_writes_closes_the_packs_it_evicts() {
    let dir = TempDir::new("pack-writes-only");
    // A pack per entry: packs of a tenth of the limit, 10,000 bytes.
    let store = PackStore::new(dir.path()).unwrap().with_limit(100_000);
    for id in 0..300 {
        store.put(&key(id), &value(id, 0, 9_000)).unwrap();
    }
    let listed = packs(dir.path()).len();
    assert!(listed <= 11, "{listed} packs listed");
    assert!(
        store.indexed() <= listed,
        "{} entries indexed, {listed} packs listed",
        store.indexed()
    );
    check_value(299, &store.get(&key(299)).unwrap().unwrap()).unwrap();
    // No file of this process is a deleted pack of the directory.
    #[cfg(target_os = "linux")]
    {
        let deleted = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter(|target| {
                target.starts_with(dir.path()) && target.to_string_lossy().ends_with("(deleted)")
            })
            .count();
        assert_eq!(deleted, 0, "deleted packs still open");
    }
}

/// One `put_many` of more entries than the limit holds scans as it starts
/// each pack: the directory never holds much more than the limit, even
/// while the batch is written (another store watching it), and the last
/// entries of the batch are there.
#[test]
fn one_large_batch_keeps_the_bound_as_it_goes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = TempDir::new("pack-large-batch");
    let limit = 1 << 20;
    let store = PackStore::new(dir.path()).unwrap().with_limit(limit);
    let entries: Vec<_> = (0..200).map(|id| (key(id), value(id, 0, 50_000))).collect();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (dir, done) = (dir.path().to_path_buf(), done.clone());
        std::thread::spawn(move || {
            let watching = PackStore::new(dir).unwrap();
            let mut most = 0;
            while !done.load(Ordering::Relaxed) {
                most = most.max(watching.usage().map_or(0, |u| u.bytes));
            }
            most
        })
    };
    store.put_many(&entries).unwrap();
    done.store(true, Ordering::Relaxed);
    let most = watcher.join().unwrap();
    // The limit, and a pack written past it before the scan that follows.
    assert!(
        most <= limit + limit / 10 + 60_000,
        "{most} bytes at most, limit {limit}"
    );
    check_value(199, &store.get(&key(199)).unwrap().unwrap()).unwrap();
}

/// Packs planted full of the smallest records (valid, empty values) cost a
/// reader an index within its budget, not one entry per 28 bytes of them;
/// its own writes are indexed all the same, and once the planted packs
/// are gone, what another store wrote is found.
#[test]
fn packs_of_tiny_records_cost_an_index_within_the_budget() {
    use jitfold::store::pack::INDEX_ENTRY_COST;
    let dir = TempDir::new("pack-tiny-records");
    std::fs::create_dir_all(dir.path()).unwrap();
    let reader = PackStore::new(dir.path()).unwrap().with_limit(1 << 20);
    let budget = reader.index_budget();
    // Two packs of 24 MiB of records with empty values: more than the
    // budget, in records of 28 bytes.
    let mut planted = Vec::new();
    for pack in 0..2u64 {
        let mut bytes = PACK_MAGIC.to_vec();
        let mut record = 0u64;
        while bytes.len() < 24 << 20 {
            let mut named = [0u8; 20];
            named[..8].copy_from_slice(&(pack << 32 | record).to_le_bytes());
            named[8] = 0xee;
            bytes.extend_from_slice(&named);
            bytes.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&named).to_le_bytes());
            record += 1;
        }
        let path = dir.path().join(format!("pack-planted-{pack}"));
        std::fs::write(&path, &bytes).unwrap();
        planted.push(path);
    }
    let records = 2 * ((24 << 20) - PACK_MAGIC.len() as u64) / 28;
    assert!(records * 28 > budget, "the packs pass the budget");
    // A miss looks at the directory: the index stays within the budget.
    assert_eq!(reader.get(&key(1)).unwrap(), None);
    let most = budget / (28 + INDEX_ENTRY_COST);
    assert!(
        reader.indexed() as u64 <= most,
        "{} entries indexed, at most {most}",
        reader.indexed()
    );
    assert!(
        reader.indexed() > 0,
        "records within the budget are indexed"
    );
    // A second look (the packs cut short have not grown): a miss, and the
    // same index (in debug builds, the pieces kept from each look do not
    // overlap, which `kept.rs` asserts).
    let first = reader.indexed();
    std::thread::sleep(REFRESH_AFTER);
    assert_eq!(reader.get(&key(4)).unwrap(), None);
    assert_eq!(reader.indexed(), first);
    // Its own writes are indexed whatever the budget; writing, it evicts
    // the planted packs (past its limit), and closes them.
    reader.put(&key(2), &value(2, 0, 100)).unwrap();
    check_value(2, &reader.get(&key(2)).unwrap().unwrap()).unwrap();
    assert!(planted.iter().all(|path| !path.exists()));
    // What another store writes is then found: the budget is free again.
    let writer = PackStore::new(dir.path()).unwrap();
    writer.put(&key(3), &value(3, 0, 100)).unwrap();
    std::thread::sleep(REFRESH_AFTER);
    check_value(3, &reader.get(&key(3)).unwrap().unwrap()).unwrap();
}

/// A directory removed under a store: errors or misses, never a panic,
/// and it works again once the directory is back.
#[test]
fn a_removed_directory_is_an_error_or_a_miss() {
    let dir = TempDir::new("pack-removed");
    let store = PackStore::new(dir.path()).unwrap();
    store.put(&key(1), b"one").unwrap();
    std::fs::remove_dir_all(dir.path()).unwrap();
    // Its own pack is still open: readable.
    assert_eq!(store.get(&key(1)).unwrap().as_deref(), Some(&b"one"[..]));
    std::thread::sleep(REFRESH_AFTER);
    assert!(store.get(&key(2)).is_err());
    let other = PackStore::new(dir.path().join("x"));
    assert!(other.is_ok());
    std::fs::remove_dir_all(dir.path()).unwrap();
    let _ = store.put(&key(3), b"three");
    assert!(store.trim().is_err());
}

/// A writer to the directory who saw the names of a process's packs
/// cannot stop its next store from starting one by making the names that
/// follow first: each name holds a keyed hash no one else can compute.
#[test]
fn names_planted_after_those_seen_do_not_stop_a_store() {
    let dir = TempDir::new("pack-planted-names");
    let first = PackStore::new(dir.path()).unwrap();
    first.put(&key(1), &value(1, 0, 100)).unwrap();
    let [seen] = &packs(dir.path())[..] else {
        panic!("one pack")
    };
    let name = seen.file_name().unwrap().to_str().unwrap().to_owned();
    let (head, count) = name.rsplit_once('-').unwrap();
    let count: u64 = count.parse().unwrap();
    // The names that follow, as the name seen suggests, many of them
    // (other tests of this process make files meanwhile).
    for next in count + 1..=count + 2000 {
        std::fs::write(dir.path().join(format!("{head}-{next}")), b"planted").unwrap();
    }
    let store = PackStore::new(dir.path()).unwrap();
    store.put(&key(2), &value(2, 0, 100)).unwrap();
    check_value(2, &store.get(&key(2)).unwrap().unwrap()).unwrap();
}
