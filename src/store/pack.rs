//! The embedded code store for warm starts: entries appended to a few pack
//! files in a directory, each held open and read at an offset, shared by
//! every process that opens the same directory, bounded in size.
//!
//! [`DirectoryStore`](super::DirectoryStore) pays a file created per entry
//! written and a file opened per entry read. A `PackStore` appends every
//! batch it is given ([`CodeStore::put_many`]) to a pack of its own with
//! one write, and reads an entry with one positioned read of a pack it
//! holds open, found in an index of every pack in the directory that it
//! builds by reading the packs once (and then only what they grew by).
//!
//! A pack (`pack-…`) starts with [`PACK_MAGIC`]; then records, each the
//! key (16 bytes), the value's length (4 bytes, little-endian), the XXH3
//! 64-bit hash of those and the value (8 bytes) and the value. Only the
//! store that created a pack appends to it (its name holds the process id,
//! a keyed hash of it and a count, and the count; it is created with
//! `O_EXCL`), so records of two writers never interleave. A store starts
//! a new pack before its pack would pass [`PACK_BYTES`] or a tenth of its
//! limit, whichever is less (a record longer than that has a pack of its
//! own).
//!
//! Whoever can write to the directory can choose the code its readers run
//! unless entries are signed (see the [trust model](super#trust-model)).
//!
//! # What this module guarantees
//!
//! 1. **No torn entries.** A reader indexes only records that lie wholly
//!    within the pack's length when it looked, and checks a record's key,
//!    length and hash when it reads it: a record still being written (or
//!    cut short by a writer that died, or by a power loss: nothing is
//!    synced) is not indexed until it is whole, and one changed since it
//!    was indexed is dropped from the index (a miss, which the caller's
//!    `put` mends), never part of a value (unless a `get` finds it kept
//!    in memory, see 7: then it is the whole record the scan checked). A
//!    store whose write failed leaves that pack (it may end in a partial
//!    record) and starts another; so does a forked child, and a store
//!    whose pack was evicted.
//! 2. **Races are misses, not errors.** Several threads and processes may
//!    put, get and evict at once. A key written to several packs is read
//!    from one of them (each a complete value `put` under it): this
//!    store's own last write if it wrote it, else the record found last,
//!    packs being read oldest first. An entry whose pack another process
//!    evicted is a miss once this store looks at the directory again
//!    (until then it is read from the pack this store holds open, which
//!    stays readable after it is deleted).
//! 3. **Bounded.** Each store counts the bytes it writes on top of the size
//!    it last scanned; when that passes the limit, or after it wrote a
//!    tenth of the limit since its last scan, or when it starts a pack, it
//!    scans the directory (unless another thread of it is scanning, which
//!    counts the write; a scan after which what was written meanwhile
//!    still passes the limit is made again, up to 8 times: the policy
//!    [`DirectoryStore`](super::DirectoryStore) shares, `bound.rs`) and,
//!    if the packs exceed the limit or number more than [`MAX_PACKS`],
//!    deletes packs in order of modification time (least recently used
//!    first; ties by name), never its own current pack and going past one
//!    it may not delete, until they are at most
//!    [`LOW_WATER_PERCENT`](super::directory::LOW_WATER_PERCENT) of the
//!    limit and [`MAX_PACKS`] in number. A pack's time is set when it is
//!    written and by a `get` from it once it was set [`TOUCH_AFTER`] ago
//!    or more, as far as the store knows (when it found the pack, or last
//!    set it): a store that lives for days keeps the packs it reads
//!    fresh, without a system call per `get`. Sizes are
//!    file lengths; files not named as packs are left alone. The bound is
//!    on what the directory lists: a deleted pack's space is freed once no
//!    store holds it open (a store closes the packs gone from the
//!    directory, those its own eviction deleted among them, whenever it
//!    next looks at it or scans it, so a store that only writes holds no
//!    more packs open than the directory lists and the packs it started
//!    since). A `put_many` of many packs counts each write as it makes it.
//!    The index holds 40 bytes or so per entry, and a store holds at most
//!    [`MAX_OPEN_PACKS`] files open.
//! 4. File system errors are [`StoreError::Io`], never panics; setting a
//!    pack's time is best effort.
//! 5. **A file planted under a pack's name costs at most a miss.** A pack
//!    is opened without following a link and without waiting on a FIFO
//!    (as [`DirectoryStore`](super::DirectoryStore)'s entries are), and
//!    kept open and read only if it is a regular file with no other name
//!    (on Unix), no longer than [`MAX_PACK_BYTES`], that starts with
//!    [`PACK_MAGIC`]; its records are read in pieces of at most
//!    [`SCAN_BYTES`], a record longer than [`MAX_ENTRY_BYTES`] or than
//!    what is left of the pack ends the scan, and a pack is read again
//!    only once it has grown (or, where the index budget below cut its
//!    scan short, at a later look, no further than the budget then left
//!    allows). `get_many` reads at most [`GET_MANY_BYTES`]
//!    in all, as the directory store's does. The records a store indexes
//!    from the packs it finds count their bytes and [`INDEX_ENTRY_COST`]
//!    each (what an entry costs the index) against its
//!    [`index_budget`](PackStore::index_budget), twice its limit (or
//!    [`MAX_PACK_BYTES`], if more): packs planted full of tiny records
//!    make misses, not an index without bound (packs are scanned oldest
//!    first, so the newest records are those missed; what a scan stopped
//!    short of is indexed once packs close and free their part;
//!    what the store writes itself is always indexed, and bounded by its
//!    eviction, see 3). Nothing outside the directory is read or touched.
//! 6. **Sees its own writes at once, others' soon.** A store indexes what
//!    it writes as it writes it, and looks at the directory (new packs,
//!    packs grown, packs gone) at a miss if it never did or last did
//!    [`REFRESH_AFTER`] ago or more (`get_many`: at its first miss).
//! 7. **A record is read from the file once.** What a scan read to index
//!    a pack, cut to the whole records it checked, is kept in memory (at
//!    most [`KEPT_BYTES`]: what would pass it is not kept; see
//!    `kept.rs`), and a `get` of a record kept copies its value from
//!    there: the scan checked the record's hash over those very bytes, so
//!    the `get` checks only that its key and length are those the index
//!    holds (a record read from the file is hashed again). Kept records
//!    are dropped once read, when their pack is closed, or at the first
//!    `get` or look at the directory [`KEEP_FOR`] after they were read
//!    from the file.

use super::bound::Bound;
use super::directory::{
    GET_MANY_BYTES, MAX_ENTRY_BYTES, TOUCH_AFTER, Usage, create_own_file, io_error, low_water,
    open_entry,
};
use super::kept::Kept;
pub use super::kept::{KEEP_FOR, KEPT_BYTES};
use super::{CodeStore, StoreError, StoreKey};
use hashbrown::HashMap;
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// The limit of a store made with [`PackStore::new`]: 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// A store starts a new pack before its pack would pass this many bytes
/// (8 MiB), or a tenth of its limit if that is less.
pub const PACK_BYTES: u64 = 8 << 20;

/// The longest pack a store reads: one that held just under
/// [`PACK_BYTES`] when the longest record was appended.
pub const MAX_PACK_BYTES: u64 = PACK_BYTES + MAX_ENTRY_BYTES + RECORD_HEADER as u64;

/// Eviction deletes the least recently used packs while there are more
/// than this many (each a file a store holds open).
pub const MAX_PACKS: usize = 128;

/// The most packs a store holds open: what it finds beyond is a miss.
pub const MAX_OPEN_PACKS: usize = 2 * MAX_PACKS;

/// What a record indexed from a scan counts for, beyond its bytes, against
/// [`PackStore::index_budget`]: about what the index spends on an entry.
pub const INDEX_ENTRY_COST: u64 = 48;

/// The most a scan reads at once: 1 MiB.
pub const SCAN_BYTES: u64 = 1 << 20;

/// A store looks at the directory again at a miss if it last did this
/// long ago (see 6 above).
pub const REFRESH_AFTER: Duration = Duration::from_millis(100);

/// The first bytes of every pack.
pub const PACK_MAGIC: [u8; 16] = *b"jitfold pack 1\n\0";

/// A record's key, length and hash.
const RECORD_HEADER: usize = 16 + 4 + 8;

const PACK_PREFIX: &str = "pack-";

/// A code store of pack files in a directory: see the [module docs](self).
#[derive(Debug)]
pub struct PackStore {
    dir: PathBuf,
    max_bytes: u64,
    index: RwLock<Index>,
    /// The pack this store appends to, once it has written.
    current: Mutex<Option<Current>>,
    /// When it scans for eviction.
    bound: Bound,
}

/// Where each key's record is, and the packs this store has open.
#[derive(Debug, Default)]
struct Index {
    /// By pack number; `None` once the pack is gone from the directory.
    packs: Vec<Option<Pack>>,
    /// Pack numbers by file name (also of files refused as packs, as
    /// `None`, so that they are not opened again).
    by_name: HashMap<String, Option<u32>>,
    /// How many of `packs` are open.
    open: usize,
    entries: HashMap<StoreKey, Location>,
    /// When the directory was last looked at.
    refreshed: Option<Instant>,
    /// What the records scans indexed from the open packs count against
    /// the index budget (see 5 above).
    charged: u64,
    /// What scans read, kept for the reads that follow (see 7 above).
    kept: Kept,
}

/// A pack this store reads.
#[derive(Debug)]
struct Pack {
    file: Arc<File>,
    /// Whether this store created it (its records win over others', see 2
    /// above).
    own: bool,
    /// Where the records indexed end.
    indexed: u64,
    /// What the records a scan indexed from it count against the index
    /// budget (see 5 above).
    charged: u64,
    /// The pack's length when it was last scanned: a pack that has not
    /// grown since is not read again.
    scanned_len: u64,
    /// When its time was last set, as far as this store knows (see 3
    /// above).
    touched: Arc<Touched>,
}

/// When a pack's time was last set, as far as a store knows: on the
/// process's clock ([`Touched::clock`]), so that a `get` sets it again
/// once it is [`TOUCH_AFTER`] old, however long the store lives, and
/// otherwise makes no system call for it.
#[derive(Debug)]
struct Touched(AtomicU64);

impl Touched {
    /// Set `age` ago (`None`: unknown, taken as just now).
    fn aged(age: Option<Duration>) -> Self {
        let now = Self::clock();
        let set = match age {
            Some(age) if age < TOUCH_AFTER => now - age.as_millis() as u64,
            Some(_) => 0,
            None => now,
        };
        Self(AtomicU64::new(set))
    }

    /// Milliseconds since the process first asked, plus [`TOUCH_AFTER`]:
    /// a time set less than that long ago is never before its start.
    fn clock() -> u64 {
        static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
        (START.elapsed() + TOUCH_AFTER).as_millis() as u64
    }

    /// Notes that the time was set just now.
    fn set_now(&self) {
        self.0.store(Self::clock(), Ordering::Relaxed);
    }

    /// Whether the time is due to be set, [`TOUCH_AFTER`] after it last
    /// was; if so, noted as set now (of callers at once, one is told so).
    fn due(&self) -> bool {
        let (now, set) = (Self::clock(), self.0.load(Ordering::Relaxed));
        now - set.min(now) >= TOUCH_AFTER.as_millis() as u64
            && self
                .0
                .compare_exchange(set, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// A record: its pack, where it starts and its value's length.
#[derive(Clone, Copy, Debug)]
struct Location {
    pack: u32,
    offset: u64,
    len: u32,
}

/// The pack a store appends to.
#[derive(Debug)]
struct Current {
    name: String,
    file: File,
    pack: u32,
    len: u64,
    /// The process that created it (a forked child starts its own).
    pid: u32,
}

impl PackStore {
    /// The store in `dir`, created if it does not exist, with a limit of
    /// [`DEFAULT_MAX_BYTES`]. The directory is read at the first `get`.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_error("create directory", dir.clone()))?;
        Ok(Self {
            dir,
            max_bytes: DEFAULT_MAX_BYTES,
            index: RwLock::default(),
            current: Mutex::default(),
            bound: Bound::new(),
        })
    }

    /// This store with a limit of `max_bytes` (at least 1).
    pub fn with_limit(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes.max(1);
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The most bytes this store writes to a pack, unless one record is
    /// longer (see the [module docs](self)).
    pub fn pack_bytes(&self) -> u64 {
        PACK_BYTES.min(self.max_bytes / 10)
    }

    /// The most the records a store indexes from scans of the directory's
    /// packs count (each its bytes and [`INDEX_ENTRY_COST`]): twice its
    /// limit, or [`MAX_PACK_BYTES`] if that is more (see 5 in the
    /// [module docs](self)).
    pub fn index_budget(&self) -> u64 {
        self.max_bytes.saturating_mul(2).max(MAX_PACK_BYTES)
    }

    /// How many entries this store's index holds (what it wrote and what
    /// it found in the directory when it last looked).
    pub fn indexed(&self) -> usize {
        self.read_index().entries.len()
    }

    /// What the directory holds: `entries` counts packs.
    pub fn usage(&self) -> Result<Usage, StoreError> {
        let packs = self.list_packs()?;
        Ok(Usage {
            entries: packs.len() as u64,
            bytes: packs.iter().fold(0u64, |sum, p| sum.saturating_add(p.len)),
            evicted: 0,
        })
    }

    /// Scans the directory and evicts packs down to the low-water mark and
    /// [`MAX_PACKS`] if it holds more (see 3 in the module docs); `entries`
    /// counts packs.
    pub fn trim(&self) -> Result<Usage, StoreError> {
        let _scanning = self.bound.lock();
        self.scan_and_evict()
    }

    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The record of `key`, if indexed: its location, the pack's file, and
    /// whether its time is to be set.
    fn locate(&self, key: &StoreKey) -> Option<(Location, Arc<File>, Arc<Touched>)> {
        let index = self.read_index();
        let at = *index.entries.get(key)?;
        let pack = index.packs[at.pack as usize].as_ref()?;
        Some((at, pack.file.clone(), pack.touched.clone()))
    }

    /// The value of the record of `key` at `at`, checked (see 1 and 7
    /// above): copied from a piece kept from a scan if one holds the
    /// record (the scan checked its hash over those very bytes, so its key
    /// and length are compared with what the index says, and its value is
    /// not hashed again), else read from `file` and its header checked.
    /// `None` if it cannot be read, or is not what was indexed.
    fn value(&self, key: &StoreKey, at: Location, file: &File) -> Option<Vec<u8>> {
        let len = RECORD_HEADER + at.len as usize;
        let (kept, due) = self
            .read_index()
            .kept
            .read(at.pack, at.offset, len, |record| {
                let (header, value) = record.split_at(RECORD_HEADER);
                let named = key_and_len(key, at.len);
                (header[..named.len()] == named).then(|| value.to_vec())
            });
        if due {
            self.write_index().kept.drop_spent();
        }
        kept.unwrap_or_else(|| {
            let mut record = vec![0; len];
            read_at(file, &mut record, at.offset).ok()?;
            let (header, value) = record.split_at(RECORD_HEADER);
            if header != record_header(key, value) {
                return None;
            }
            record.drain(..RECORD_HEADER);
            Some(record)
        })
    }

    /// Looks at the directory again, after a miss, if it never did or
    /// last did [`REFRESH_AFTER`] ago or more (see 6 above); whether it
    /// did.
    fn refresh_if_due(&self) -> Result<bool, StoreError> {
        let due = |index: &Index| {
            index
                .refreshed
                .is_none_or(|at| at.elapsed() >= REFRESH_AFTER)
        };
        if !due(&self.read_index()) {
            return Ok(false);
        }
        let mut index = self.write_index();
        if !due(&index) {
            return Ok(false);
        }
        self.refresh(&mut index)?;
        Ok(true)
    }

    /// Indexes new packs and what known packs grew by, and closes packs
    /// gone from the directory.
    fn refresh(&self, index: &mut Index) -> Result<(), StoreError> {
        let mut seen = hashbrown::HashSet::new();
        // Oldest first, so that a key's newest record is the one indexed
        // (see 2 above).
        let mut listed: Vec<_> = self
            .named_as_packs()?
            .into_iter()
            .map(|(name, item)| {
                let modified = item.metadata().and_then(|m| m.modified()).ok();
                (modified, name, item)
            })
            .collect();
        listed.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        for (_, name, item) in listed {
            let number = match index.by_name.get(&name) {
                Some(number) => *number,
                None if index.open >= MAX_OPEN_PACKS => None,
                None => match open_pack(&item.path()) {
                    Opened::Pack(file) => {
                        let number = index.add(file, false);
                        index.by_name.insert(name.clone(), Some(number));
                        Some(number)
                    }
                    Opened::Refused => {
                        index.by_name.insert(name.clone(), None);
                        None
                    }
                    // Asked again at the next look.
                    Opened::NotYet => None,
                },
            };
            seen.insert(name);
            if let Some(number) = number {
                index.scan(number, self.index_budget());
            }
        }
        index.close_unlisted(|name| seen.contains(name), index.packs.len(), true);
        index.kept.drop_spent();
        index.refreshed = Some(Instant::now());
        Ok(())
    }

    /// The value of the record at `at`, checked (see 1 above); its pack's
    /// time set if due. A record that is not what was indexed (changed
    /// since, or cut short) is dropped from the index: a miss, which a
    /// `put` of the key mends.
    fn read(
        &self,
        key: &StoreKey,
        (at, file, touched): (Location, Arc<File>, Arc<Touched>),
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(value) = self.value(key, at, &file) else {
            log::debug!(
                "code store: a record in `{}` is not what was indexed; dropped",
                self.dir.display()
            );
            let mut index = self.write_index();
            if index
                .entries
                .get(key)
                .is_some_and(|now| (now.pack, now.offset) == (at.pack, at.offset))
            {
                index.entries.remove(key);
            }
            return Ok(None);
        };
        if touched.due() {
            let _ = file.set_modified(SystemTime::now());
        }
        Ok(Some(value))
    }

    /// A new pack of this store's, its header written and registered in
    /// the index.
    fn create_pack(&self) -> Result<Current, StoreError> {
        let (path, mut file) =
            create_own_file(&self.dir, |unique| format!("{PACK_PREFIX}{unique}"))?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("named above")
            .to_owned();
        if let Err(e) = file.write_all(&PACK_MAGIC) {
            let _ = fs::remove_file(&path);
            return Err(io_error("write", path)(e));
        }
        let reader = file.try_clone().map_err(io_error("open", path))?;
        let pack = {
            let mut index = self.write_index();
            let number = match index.by_name.get(&name) {
                // Found by a look at the directory since it was created.
                Some(&Some(number)) => {
                    if let Some(pack) = index.packs[number as usize].as_mut() {
                        pack.own = true;
                    }
                    number
                }
                _ => index.add(reader, true),
            };
            index.by_name.insert(name.clone(), Some(number));
            number
        };
        Ok(Current {
            name,
            file,
            pack,
            len: PACK_MAGIC.len() as u64,
            pid: std::process::id(),
        })
    }

    /// Appends `records` to this store's pack with one write, starting a
    /// pack first if there is none or it would pass
    /// [`PackStore::pack_bytes`] (unless it holds no record), and indexes
    /// them. Returns whether it started a pack.
    fn append(&self, records: &Records) -> Result<bool, StoreError> {
        let Records {
            bytes: records,
            keys,
        } = records;
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| {
            c.len > PACK_MAGIC.len() as u64 && c.len + records.len() as u64 > self.pack_bytes()
                // Evicted (by another process, say): what it would hold
                // is a miss once this store looks again.
                || self.read_index().packs[c.pack as usize].is_none()
                // A forked child shares the file and its offset.
                || c.pid != std::process::id()
        }) {
            *current = None;
        }
        let started = current.is_none();
        if started {
            *current = Some(self.create_pack()?);
        }
        let pack = current.as_mut().expect("made above");
        if let Err(e) = write_at(&pack.file, records, pack.len) {
            let path = self.dir.join(&pack.name);
            *current = None;
            return Err(io_error("write", path)(e));
        }
        let start = pack.len;
        pack.len += records.len() as u64;
        let mut index = self.write_index();
        let Some(indexed) = index.packs[pack.pack as usize].as_mut() else {
            // Closed since it was checked above (evicted, by another
            // process say): what it holds is a miss, as it would be once
            // this store looked again, and the next write starts a pack.
            *current = None;
            return Ok(started);
        };
        indexed.indexed = indexed.indexed.max(pack.len);
        // Written now: its time is fresh.
        indexed.touched.set_now();
        for &(key, offset, len) in keys {
            let at = Location {
                pack: pack.pack,
                offset: start + offset as u64,
                len,
            };
            index.entries.insert(key, at);
        }
        Ok(started)
    }

    /// What the directory lists under names packs have, with the names.
    fn named_as_packs(&self) -> Result<Vec<(String, fs::DirEntry)>, StoreError> {
        let listing = fs::read_dir(&self.dir).map_err(io_error("list", self.dir.clone()))?;
        Ok(listing
            .filter_map(|item| {
                let item = item.ok()?;
                let name = item.file_name().into_string().ok()?;
                name.starts_with(PACK_PREFIX).then_some((name, item))
            })
            .collect())
    }

    /// The packs in the directory: regular files named as packs.
    fn list_packs(&self) -> Result<Vec<Listed>, StoreError> {
        let mut packs = Vec::new();
        for (name, item) in self.named_as_packs()? {
            // Gone since it was listed: another process evicted it.
            let Ok(meta) = item.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            packs.push(Listed {
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                len: meta.len(),
                name,
            });
        }
        Ok(packs)
    }

    fn scan_and_evict(&self) -> Result<Usage, StoreError> {
        let counted = self.bound.scan_started();
        // Packs this store opens or creates from here on may be missing
        // from the listing: they are not closed below.
        let known = self.read_index().packs.len();
        let mut packs = self.list_packs()?;
        let mut bytes = packs.iter().fold(0u64, |sum, p| sum.saturating_add(p.len));
        let own = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|c| c.name.clone());
        let mut evicted = 0;
        let mut left = packs.len();
        let mut deleted = hashbrown::HashSet::new();
        if bytes > self.max_bytes || left > MAX_PACKS {
            let low_water = low_water(self.max_bytes);
            packs.sort_by(|a, b| (a.modified, &a.name).cmp(&(b.modified, &b.name)));
            for pack in &packs {
                if bytes <= low_water && left <= MAX_PACKS {
                    break;
                }
                if own.as_deref() == Some(&pack.name) {
                    continue;
                }
                let path = self.dir.join(&pack.name);
                match fs::remove_file(&path) {
                    Ok(()) => evicted += 1,
                    // Gone already: another process evicted it.
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    // Not this store's to delete, say: the next one is.
                    Err(e) => {
                        log::debug!("code store: evicting `{}` failed: {e}", path.display());
                        continue;
                    }
                }
                bytes = bytes.saturating_sub(pack.len);
                left -= 1;
                deleted.insert(pack.name.as_str());
            }
        }
        // The packs it holds open that are gone from the directory (deleted
        // here or by another process) are closed, their space freed once
        // no other store holds them (see 3 above).
        let left_listed: hashbrown::HashSet<&str> = packs
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| !deleted.contains(name))
            .collect();
        // (Names refused as packs stay known: the listing leaves out
        // what is not a regular file.)
        self.write_index()
            .close_unlisted(|name| left_listed.contains(name), known, false);
        self.bound.scanned(counted, bytes);
        Ok(Usage {
            entries: left as u64,
            bytes,
            evicted,
        })
    }

    /// Counts `len` written bytes, and scans if the limit may be passed or
    /// (`new_pack`) the number of packs grew (see 3 in the module docs).
    /// Eviction errors are logged, not returned: the value was stored.
    fn account(&self, len: u64, new_pack: bool) {
        self.bound
            .account(len, new_pack, self.max_bytes, &self.dir, || {
                self.scan_and_evict()
            });
    }
}

/// Whole records to append with one write, and each one's key, offset in
/// them and value length.
#[derive(Default)]
struct Records {
    bytes: Vec<u8>,
    keys: Vec<(StoreKey, usize, u32)>,
}

/// A pack as listed for eviction.
struct Listed {
    name: String,
    len: u64,
    modified: SystemTime,
}

impl Index {
    /// Closes the packs numbered below `known` whose names `listed` says
    /// the directory no longer holds, and forgets their records (packs
    /// numbered from `known` on were opened or created after the
    /// directory was listed); forgets the names refused as packs that it
    /// does not list too if `all_names` (`listed` then says of every name
    /// whether the directory holds it).
    fn close_unlisted(&mut self, listed: impl Fn(&str) -> bool, known: usize, all_names: bool) {
        let mut gone = Vec::new();
        self.by_name.retain(|name, number| match number {
            Some(number) if (*number as usize) < known && !listed(name) => {
                gone.push(*number);
                false
            }
            Some(_) => true,
            None => !all_names || listed(name),
        });
        if gone.is_empty() {
            return;
        }
        for &number in &gone {
            if let Some(pack) = self.packs[number as usize].take() {
                self.open -= 1;
                self.charged -= pack.charged;
            }
            self.kept.drop_pack(number);
        }
        self.entries
            .retain(|_, at| self.packs[at.pack as usize].is_some());
    }

    /// Registers an opened pack; its number.
    fn add(&mut self, file: File, own: bool) -> u32 {
        let age = file
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|set| SystemTime::now().duration_since(set).ok());
        self.open += 1;
        self.packs.push(Some(Pack {
            file: Arc::new(file),
            own,
            indexed: 0,
            charged: 0,
            scanned_len: 0,
            touched: Arc::new(Touched::aged(age)),
        }));
        (self.packs.len() - 1) as u32
    }

    /// Indexes the whole records pack `number` grew by since it was last
    /// scanned (see 1 and 5 above). A pack that cannot be read is left as
    /// it is; one that has not grown since it was last scanned is not read.
    fn scan(&mut self, number: u32, budget: u64) {
        let left = budget.saturating_sub(self.charged);
        let Some(pack) = self.packs[number as usize].as_mut() else {
            return;
        };
        let Ok(len) = pack.file.metadata().map(|m| m.len().min(MAX_PACK_BYTES)) else {
            return;
        };
        if len == pack.scanned_len || left == 0 {
            return;
        }
        let (file, own, from) = (pack.file.clone(), pack.own, pack.indexed);
        // Read no further than the budget left can index (each record
        // counts its bytes and more): what lies beyond is scanned once
        // packs close (the pack's length is not taken as scanned).
        let until = len.min(from.max(PACK_MAGIC.len() as u64).saturating_add(left));
        let mut found = Vec::new();
        let (mut charged, mut cut) = (0, false);
        let kept = &mut self.kept;
        // The scan stops at the first record the budget left cannot
        // index, before it keeps any of its bytes: the pieces kept end
        // where the records indexed do.
        let end = scan_records(
            &file,
            from,
            until,
            |key, at, value_len| {
                let charge = RECORD_HEADER as u64 + u64::from(value_len) + INDEX_ENTRY_COST;
                cut = charged + charge > left;
                if !cut {
                    charged += charge;
                    found.push((key, at, value_len));
                }
                !cut
            },
            |at, bytes, records| kept.keep(number, at, bytes, records),
        );
        if let Some(pack) = self.packs[number as usize].as_mut() {
            // Cut short: the rest at a later look.
            pack.scanned_len = if cut { end } else { until };
        }
        for (key, offset, len) in found {
            let location = Location {
                pack: number,
                offset,
                len,
            };
            // This store's own records win over others' (see 2 above).
            let theirs_only =
                |at: &Location| !self.packs[at.pack as usize].as_ref().is_some_and(|p| p.own);
            if own || self.entries.get(&key).is_none_or(theirs_only) {
                self.entries.insert(key, location);
            }
        }
        self.charged += charged;
        if let Some(pack) = self.packs[number as usize].as_mut() {
            pack.indexed = pack.indexed.max(end);
            pack.charged += charged;
        }
    }
}

/// Calls `found` with the key, offset and value length of each whole
/// record of `file` from `from` (0: the start, after checking the magic)
/// to `len`, until it returns `false` (for a record not taken: the scan
/// ends before it), reading at most [`SCAN_BYTES`] at a time, and `read`
/// with each piece read that holds whole records taken, cut where the
/// last of them ends (its offset, its bytes, which are those records, all
/// checked, and their length); returns where the last whole record taken
/// ends (see 1 and 5 above).
fn scan_records(
    file: &File,
    from: u64,
    len: u64,
    mut found: impl FnMut(StoreKey, u64, u32) -> bool,
    mut read: impl FnMut(u64, Vec<u8>, u64),
) -> u64 {
    let mut at = from;
    if at == 0 {
        let mut magic = [0; PACK_MAGIC.len()];
        if read_at(file, &mut magic, 0).is_err() || magic != PACK_MAGIC {
            return 0;
        }
        at = PACK_MAGIC.len() as u64;
    }
    let mut piece = Vec::new();
    let mut piece_at = at;
    // Bytes of the records wholly in `piece`, which start at `piece_at`
    // (a record only partly in it comes after them, and is the last).
    let mut in_piece = 0;
    let mut hand = |piece_at: u64, mut piece: Vec<u8>, in_piece: u64| {
        if in_piece > 0 {
            piece.truncate(in_piece as usize);
            piece.shrink_to_fit();
            read(piece_at, piece, in_piece);
        }
    };
    while at + RECORD_HEADER as u64 <= len {
        let end = piece_at + piece.len() as u64;
        if at < piece_at || at + RECORD_HEADER as u64 > end {
            let next = vec![0; (len - at).min(SCAN_BYTES) as usize];
            hand(piece_at, std::mem::replace(&mut piece, next), in_piece);
            in_piece = 0;
            if read_at(file, &mut piece, at).is_err() {
                break;
            }
            piece_at = at;
        }
        let header = &piece[(at - piece_at) as usize..][..RECORD_HEADER];
        let key = StoreKey::from_bytes(header[..16].try_into().expect("16 bytes"));
        let value_len = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes"));
        let record_end = at + (RECORD_HEADER as u64) + u64::from(value_len);
        if u64::from(value_len) > MAX_ENTRY_BYTES || record_end > len {
            break;
        }
        // A record within the piece read is checked now (a longer one
        // when it is read): one that does not match is not whole yet,
        // or not a record, and ends the scan.
        let start = (at - piece_at) as usize;
        let value = piece.get(start + RECORD_HEADER..start + RECORD_HEADER + value_len as usize);
        if value.is_some_and(|value| *header != record_header(&key, value)) {
            break;
        }
        if !found(key, at, value_len) {
            break;
        }
        if value.is_some() {
            in_piece += record_end - at;
        }
        at = record_end;
    }
    hand(piece_at, piece, in_piece);
    at
}

impl CodeStore for PackStore {
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        let found = match self.locate(key) {
            Some(found) => Some(found),
            None if self.refresh_if_due()? => self.locate(key),
            None => None,
        };
        match found {
            Some(found) => self.read(key, found),
            None => Ok(None),
        }
    }

    /// Reads at most [`GET_MANY_BYTES`] in all (see 5 above).
    fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut refreshed = false;
        let mut read: u64 = 0;
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            let mut found = self.locate(key);
            if found.is_none() && !refreshed {
                refreshed = true;
                if self.refresh_if_due()? {
                    found = self.locate(key);
                }
            }
            let Some(found) = found else {
                values.push(None);
                continue;
            };
            let len = u64::from(found.0.len);
            if read + len > GET_MANY_BYTES {
                return Err(StoreError::TooLarge {
                    len,
                    limit: GET_MANY_BYTES - read,
                });
            }
            read += len;
            values.push(self.read(key, found)?);
        }
        Ok(values)
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        self.put_many(&[(*key, value.to_vec())])
    }

    /// One write per pack the entries fill (see the [module docs](self));
    /// an entry larger than [`MAX_ENTRY_BYTES`] or the low-water mark is
    /// not stored, and is the error.
    fn put_many(&self, entries: &[(StoreKey, Vec<u8>)]) -> Result<(), StoreError> {
        let limit = low_water(self.max_bytes).min(MAX_ENTRY_BYTES);
        let mut first_error = None;
        // The writes, each no longer than a pack holds (unless one record
        // is).
        let mut writes = vec![Records::default()];
        for (key, value) in entries {
            let len = value.len() as u64;
            if len > limit {
                first_error.get_or_insert(StoreError::TooLarge { len, limit });
                continue;
            }
            let last = writes.last().expect("one at least");
            if !last.bytes.is_empty()
                && (PACK_MAGIC.len() + last.bytes.len() + RECORD_HEADER) as u64 + len
                    > self.pack_bytes()
            {
                writes.push(Records::default());
            }
            let last = writes.last_mut().expect("one at least");
            last.keys.push((*key, last.bytes.len(), len as u32));
            last.bytes.extend_from_slice(&record_header(key, value));
            last.bytes.extend_from_slice(value);
        }
        // Each write counted as it is made, so that a batch of many packs
        // scans as it goes (see 3 above).
        for records in writes.iter().filter(|records| !records.bytes.is_empty()) {
            let started = match self.append(records) {
                Ok(new_pack) => new_pack,
                Err(e) => {
                    first_error.get_or_insert(e);
                    false
                }
            };
            self.account(records.bytes.len() as u64, started);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A record's header: the key, the value's length and the hash of both
/// and the value.
fn record_header(key: &StoreKey, value: &[u8]) -> [u8; RECORD_HEADER] {
    let mut header = [0; RECORD_HEADER];
    let named = key_and_len(key, value.len() as u32);
    header[..named.len()].copy_from_slice(&named);
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(&named);
    hasher.update(value);
    header[20..].copy_from_slice(&hasher.digest().to_le_bytes());
    header
}

/// The start of a record's header: the key, then the value's length.
fn key_and_len(key: &StoreKey, len: u32) -> [u8; 20] {
    let mut named = [0; 20];
    named[..16].copy_from_slice(key.as_bytes());
    named[16..].copy_from_slice(&len.to_le_bytes());
    named
}

/// What [`open_pack`] found.
enum Opened {
    /// A pack, open.
    Pack(File),
    /// Not a pack this store reads, nor ever will be (see 5 above).
    Refused,
    /// Not now: shorter than a pack's magic (its writer has just created
    /// it), or it could not be opened (no descriptor left, say).
    NotYet,
}

/// Opens the file at `path` as a pack if it is one this store reads: a
/// regular file, not a link (nor, on Unix, a file with another name
/// elsewhere), no longer than [`MAX_PACK_BYTES`], that starts with
/// [`PACK_MAGIC`] (see 5 above).
fn open_pack(path: &Path) -> Opened {
    let file = match open_entry(path) {
        Ok(Some(file)) => file,
        Ok(None) => return Opened::NotYet,
        Err(e) if e.kind() == ErrorKind::InvalidData => return Opened::Refused,
        Err(_) => return Opened::NotYet,
    };
    let Ok(meta) = file.metadata() else {
        return Opened::NotYet;
    };
    #[cfg(unix)]
    let linked = std::os::unix::fs::MetadataExt::nlink(&meta) > 1;
    #[cfg(not(unix))]
    let linked = false;
    if !meta.is_file() || linked || meta.len() > MAX_PACK_BYTES {
        return Opened::Refused;
    }
    let mut magic = [0; PACK_MAGIC.len()];
    match read_at(&file, &mut magic, 0) {
        Ok(()) if magic == PACK_MAGIC => Opened::Pack(file),
        Ok(()) => Opened::Refused,
        Err(_) => Opened::NotYet,
    }
}

/// Writes all of `buf` to `file` at `offset`. A pack's records are
/// written at the length the store counts, not at the file's position,
/// which reads move on Windows (`seek_read`) and which the pack's readers
/// share with its writer (a clone of its handle).
fn write_at(file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            match std::os::windows::fs::FileExt::seek_write(
                file,
                &buf[done..],
                offset + done as u64,
            )? {
                0 => return Err(ErrorKind::WriteZero.into()),
                n => done += n,
            }
        }
        Ok(())
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = (file, buf, offset);
        Err(ErrorKind::Unsupported.into())
    }
}

/// Fills `buf` from `file` at `offset` (on Windows, moving the file's
/// position, which no write of a pack uses: see [`write_at`]).
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            match std::os::windows::fs::FileExt::seek_read(
                file,
                &mut buf[done..],
                offset + done as u64,
            )? {
                0 => return Err(ErrorKind::UnexpectedEof.into()),
                n => done += n,
            }
        }
        Ok(())
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = (file, buf, offset);
        Err(ErrorKind::Unsupported.into())
    }
}

#[cfg(test)]
mod tests {
    use super::{PACK_MAGIC, RECORD_HEADER, record_header, scan_records};
    use crate::store::StoreKey;

    /// A pack file holding `records` (key byte, value length), each whole
    /// and with its hash, in a file of this process's own.
    fn pack_of(name: &str, records: &[(u8, usize)]) -> (std::path::PathBuf, std::fs::File) {
        let mut bytes = PACK_MAGIC.to_vec();
        for &(k, len) in records {
            let value = vec![k; len];
            bytes.extend_from_slice(&record_header(&StoreKey::from_bytes([k; 16]), &value));
            bytes.extend_from_slice(&value);
        }
        let path = std::env::temp_dir().join(format!("jitfold-{name}-{}", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        (path, file)
    }

    /// Each piece a scan hands over is the whole records it checked, and
    /// nothing more: none that holds no whole record (a planted pack of
    /// records longer than a piece costs one piece at a time, not the
    /// pack), and no bytes past the last whole record.
    #[test]
    fn a_scan_hands_over_only_whole_records_it_checked() {
        let big = super::SCAN_BYTES as usize;
        let (path, file) = pack_of("scan-big", &[(1, big), (2, big), (3, 10)]);
        let len = file.metadata().unwrap().len();
        let mut pieces = Vec::new();
        let mut found = 0;
        let end = scan_records(
            &file,
            0,
            len,
            |_, _, _| {
                found += 1;
                true
            },
            |at, b, r| pieces.push((at, b.len(), r)),
        );
        assert_eq!((found, end), (3, len));
        // Only the last record fits a piece.
        let last = len - (RECORD_HEADER as u64 + 10);
        assert_eq!(
            pieces,
            [(last, RECORD_HEADER + 10, RECORD_HEADER as u64 + 10)]
        );
        std::fs::remove_file(path).unwrap();

        let (path, file) = pack_of("scan-small", &[(1, 100), (2, 50)]);
        let len = file.metadata().unwrap().len();
        // The pack one byte shorter: the second record is not whole.
        let mut pieces = Vec::new();
        let end = scan_records(
            &file,
            0,
            len - 1,
            |_, _, _| true,
            |at, b, r| pieces.push((at, b, r)),
        );
        let first = (PACK_MAGIC.len() + RECORD_HEADER + 100) as u64;
        assert_eq!(end, first, "the second is not whole");
        let [(at, bytes, records)] = &pieces[..] else {
            panic!("one piece: {pieces:?}")
        };
        assert_eq!(
            (*at, bytes.len() as u64, *records),
            (PACK_MAGIC.len() as u64, first - 16, first - 16)
        );
        assert_eq!(bytes[RECORD_HEADER..], [1; 100]);
        std::fs::remove_file(path).unwrap();
    }
}

#[cfg(test)]
mod read_tests {
    use super::{Kept, PackStore};
    use crate::store::{CodeStore, StoreKey};

    /// A record at the location the index holds for a key, but of another
    /// key, is a miss, whether it is copied from what a scan kept (where
    /// only its key and length are compared, see 7 in the module docs) or
    /// read from the file (where its hash is checked too), and the key is
    /// dropped from the index; the other key reads as before.
    #[test]
    fn a_record_not_of_the_key_indexed_is_a_miss_from_memory_or_file() {
        let dir = std::env::temp_dir().join(format!("jitfold-pack-indexed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (a, b) = (StoreKey::from_bytes([1; 16]), StoreKey::from_bytes([2; 16]));
        // Values of one length, so that only the key tells them apart.
        let (value_a, value_b) = (vec![10u8; 300], vec![20u8; 300]);
        let writer = PackStore::new(&dir).unwrap();
        writer
            .put_many(&[(a, value_a.clone()), (b, value_b.clone())])
            .unwrap();
        for from_file in [false, true] {
            // A store of its own scans the writer's pack (at its first
            // miss) and keeps what it read.
            let reader = PackStore::new(&dir).unwrap();
            assert_eq!(reader.get(&StoreKey::from_bytes([3; 16])).unwrap(), None);
            {
                let mut index = reader.write_index();
                let at_b = index.entries[&b];
                index.entries.insert(a, at_b);
                if from_file {
                    index.kept = Kept::default();
                }
            }
            assert_eq!(reader.get(&a).unwrap(), None, "from the file: {from_file}");
            assert!(!reader.read_index().entries.contains_key(&a));
            assert_eq!(reader.get(&b).unwrap(), Some(value_b.clone()));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A store that reads a pack sets its time again each time it is
    /// [`TOUCH_AFTER`](super::TOUCH_AFTER) old, however long the store
    /// lives (and not at every `get` in between).
    #[test]
    fn a_pack_read_is_made_fresh_again_each_time_it_ages() {
        use std::time::{Duration, SystemTime};
        let dir = std::env::temp_dir().join(format!("jitfold-pack-touch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = StoreKey::from_bytes([1; 16]);
        PackStore::new(&dir).unwrap().put(&a, &[7; 100]).unwrap();
        let pack = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("pack-")
            })
            .unwrap();
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        let age_back = || {
            let file = std::fs::File::options().write(true).open(&pack).unwrap();
            file.set_modified(hour_ago).unwrap();
        };
        let fresh = || {
            let set = std::fs::metadata(&pack).unwrap().modified().unwrap();
            SystemTime::now().duration_since(set).unwrap_or_default() < Duration::from_secs(600)
        };
        age_back();
        let reader = PackStore::new(&dir).unwrap();
        // The process's clock past its start, so that the note aged below
        // is not 0, as the note of a pack found old is.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(reader.get(&a).unwrap(), Some(vec![7; 100]));
        assert!(fresh(), "found an hour old: set by the first get");
        age_back();
        assert_eq!(reader.get(&a).unwrap(), Some(vec![7; 100]));
        assert!(!fresh(), "set just now, as far as the store knows: left");
        // The store's note of setting it, a minute older.
        for pack in reader.read_index().packs.iter().flatten() {
            let set = pack.touched.0.load(std::sync::atomic::Ordering::Relaxed);
            let minute = super::TOUCH_AFTER.as_millis() as u64;
            pack.touched
                .0
                .store(set - minute, std::sync::atomic::Ordering::Relaxed);
        }
        assert_eq!(reader.get(&a).unwrap(), Some(vec![7; 100]));
        assert!(fresh(), "set again once a minute old");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
