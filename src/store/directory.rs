//! The embedded code store: one file per entry in a directory, shared by
//! every process that opens the same directory, bounded in size.
//!
//! Each value is the file named by its key's 32 hex digits
//! ([`StoreKey::hex`]). A `put` writes a temporary file in the same
//! directory (`.tmp-…`, a name no other writer uses; on Linux, a file
//! made without a name and given that name once written, see 6 below)
//! and renames it over the entry's name; a `get` reads the file and sets
//! its modification time to now (if it was set more than [`TOUCH_AFTER`]
//! ago), which is what eviction orders by.
//!
//! Whoever can write to the directory can choose the code its readers run
//! unless entries are signed (see the [trust model](super#trust-model)):
//! give it permissions that only trusted writers have. [`DirectoryStore::new`]
//! creates it with the process's default permissions.
//!
//! # What this module guarantees
//!
//! 1. **No torn entries.** Rename within a directory is atomic on POSIX
//!    file systems: a reader opens either the old file or the new one,
//!    both complete, and reads what it opened even if the name is replaced
//!    or removed meanwhile. A writer that dies mid-write leaves only a
//!    temporary file, which no `get` reads and which eviction deletes once
//!    it is [`STALE_TEMP_AGE`] old. A power loss may leave a short entry
//!    (nothing is synced to disk), which [`Entry`](super::Entry)'s checksum
//!    rejects.
//! 2. **Races are misses, not errors.** Several threads and processes may
//!    put, get and evict the same or different keys at once: the last
//!    rename wins, an entry evicted by another process is a miss, and a
//!    file that vanishes while being evicted is not an error.
//! 3. **Bounded.** Each store counts the bytes it writes on top of the
//!    size it last scanned. When that passes the limit, or after it wrote a
//!    tenth of the limit since its last scan (so that other processes'
//!    writes are seen), it scans the directory and, if the entries and
//!    fresh temporary files exceed the limit, deletes entries in order of
//!    modification time (least recently used first; ties by name; going
//!    past one it may not delete) until they are at most the low-water
//!    mark, [`LOW_WATER_PERCENT`] of the limit; a scan after which what
//!    other threads of the store wrote meanwhile still passes the limit
//!    is made again (up to 8 times; the policy `bound.rs` gives both
//!    embedded stores). So
//!    the directory exceeds its limit by at most what the processes
//!    writing it write between two scans of theirs (a tenth of the limit
//!    each). Sizes are file lengths, not disk blocks; files that
//!    are neither entries nor temporary files are left alone and not
//!    counted.
//! 4. File system errors (a directory removed, a full disk, no
//!    permission) are [`StoreError::Io`], never panics. Setting a file's
//!    time on `get` is best effort: in a directory this process may read
//!    but not write, `get` still works (eviction order then ignores its
//!    reads).
//! 5. **A file planted under an entry's name costs at most a miss.**
//!    `get` looks at the name without following a link, and reads only a
//!    regular file (a FIFO would wait for a writer forever, a device might
//!    never end; a link could lead out of the directory) no longer than
//!    the low-water mark (or the default store's, if higher: more than any
//!    entry a store of either limit writes) and than [`MAX_ENTRY_BYTES`],
//!    checked on the file it opened before anything is read (on Unix it
//!    opens with `O_NOFOLLOW | O_NONBLOCK`, so no link is followed even if
//!    swapped in, and no FIFO waited on). Anything else
//!    is a [`StoreError::Io`], and nothing outside the directory is read
//!    or touched (`get` sets the time of the file it read, eviction
//!    deletes only regular files named as entries in it). `get_many` reads
//!    at most [`GET_MANY_BYTES`] in all: it fails rather than read an entry
//!    that would take it past that (its caller then asks for each entry on
//!    its own).
//! 6. **Writing does not hold up reading.** Creating a named file locks
//!    its directory for as long as the file system takes to allocate
//!    the file: up to a millisecond on ext4 once many files were deleted
//!    (a store emptied and filled again), and every `get` of a missing
//!    entry meanwhile waits for it (measured: lookups of missing names
//!    took 0.6 ms on average while another thread wrote 2,683 entries,
//!    where they take 10 µs otherwise). On Linux, where the file system
//!    makes files without a name (`O_TMPFILE`), a `put` writes its entry
//!    into one, then links it into the directory under its temporary
//!    name (`linkat` of its `/proc/self/fd` link; the new name is not
//!    followed, and one that exists is not replaced) and renames that,
//!    as above: the directory is locked only to add names. The name
//!    linked is checked to be the file written (the same device and
//!    inode), so that a `/proc` that is not the kernel's cannot lead the
//!    store to name a file from elsewhere. A writer that dies before the
//!    link leaves nothing behind. Where no such file can be made, or
//!    linked (no `/proc`, a sandbox that refuses the link, a name that
//!    is not the file written: then no later `put` of the process tries),
//!    the temporary file is created with its name.

use super::bound::Bound;
use super::{CodeStore, StoreError, StoreKey};
use std::collections::hash_map::RandomState;
use std::fs::{self, File, OpenOptions};
use std::hash::BuildHasher;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// The limit of a store made with [`DirectoryStore::new`]: 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Eviction deletes entries until the directory holds at most this
/// percentage of the limit.
pub const LOW_WATER_PERCENT: u64 = 80;

/// The low-water mark of a store with the default limit: the longest file
/// `get` reads, unless its own low-water mark is higher.
const DEFAULT_LOW_WATER_BYTES: u64 = low_water(DEFAULT_MAX_BYTES);

/// [`LOW_WATER_PERCENT`] of `max_bytes`, without overflow.
pub(super) const fn low_water(max_bytes: u64) -> u64 {
    max_bytes / 100 * LOW_WATER_PERCENT + max_bytes % 100 * LOW_WATER_PERCENT / 100
}

/// The longest entry a store writes or reads: 32 MiB (a function with
/// 1.25 MB of machine code makes an entry of about 3.4 MB). A longer value
/// is not stored ([`StoreError::TooLarge`]), and a longer file is not read.
pub const MAX_ENTRY_BYTES: u64 = 32 << 20;

/// The most [`CodeStore::get_many`] reads in one call: 64 MiB. Entries
/// adding up to more are asked for one at a time (each checked before the
/// next is read), so that a batch never holds more unchecked bytes.
pub const GET_MANY_BYTES: u64 = 64 << 20;

/// A `get` sets an entry's time (what eviction orders by) only if it was
/// set longer ago than this: eviction is least recently used to within a
/// minute, and a warm start repeated within a minute writes nothing to the
/// file system (setting the time cost about a tenth of a warm start of
/// the SQLite corpus, 2,683 entries).
pub const TOUCH_AFTER: Duration = Duration::from_secs(60);

/// Temporary files older than this are left over from a writer that died,
/// and eviction deletes them.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(10 * 60);

const TEMP_PREFIX: &str = ".tmp-";

/// Numbers the files this process creates in stores (see
/// [`create_own_file`]).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// A code store in a directory: see the [module docs](self).
#[derive(Debug)]
pub struct DirectoryStore {
    dir: PathBuf,
    max_bytes: u64,
    /// When it scans (other processes may scan at the same time).
    bound: Bound,
}

/// What a scan of a [`DirectoryStore`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Entry files.
    pub entries: u64,
    /// Bytes of entry files and of temporary files not yet stale.
    pub bytes: u64,
    /// Entries deleted by this scan.
    pub evicted: u64,
}

impl DirectoryStore {
    /// The store in `dir`, created if it does not exist, with a limit of
    /// [`DEFAULT_MAX_BYTES`]. The directory is scanned at the first `put`,
    /// not here.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            operation: "create directory",
            path: dir.clone(),
            source,
        })?;
        Ok(Self {
            dir,
            max_bytes: DEFAULT_MAX_BYTES,
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

    /// The low-water mark eviction goes down to, in bytes; also the
    /// largest value kept.
    pub fn low_water_bytes(&self) -> u64 {
        low_water(self.max_bytes)
    }

    /// The path of `key`'s entry.
    pub fn path_of(&self, key: &StoreKey) -> PathBuf {
        self.dir.join(key.hex())
    }

    /// Scans the directory and, if it holds more than the limit, evicts
    /// entries down to the low-water mark (see the [module docs](self));
    /// deletes stale temporary files either way. Returns what is left.
    pub fn trim(&self) -> Result<Usage, StoreError> {
        let _scanning = self.bound.lock();
        self.scan_and_evict()
    }

    /// What the directory holds, without evicting anything (stale
    /// temporary files are not counted, nor deleted).
    pub fn usage(&self) -> Result<Usage, StoreError> {
        let files = self.scan(false)?;
        Ok(Usage {
            entries: files.iter().filter(|f| f.entry).count() as u64,
            bytes: files.iter().fold(0u64, |sum, f| sum.saturating_add(f.len)),
            evicted: 0,
        })
    }

    fn io_error(
        &self,
        operation: &'static str,
        path: PathBuf,
    ) -> impl FnOnce(std::io::Error) -> StoreError {
        io_error(operation, path)
    }

    /// The files that count towards the size, deleting stale temporary
    /// files when `clean`. A file that cannot be listed or looked at (gone
    /// since the listing began, say) does not count.
    fn scan(&self, clean: bool) -> Result<Vec<Counted>, StoreError> {
        let now = SystemTime::now();
        let mut files = Vec::new();
        let listing = fs::read_dir(&self.dir).map_err(self.io_error("list", self.dir.clone()))?;
        for item in listing {
            let Ok(item) = item else { continue };
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            let entry = StoreKey::from_hex(name).is_some();
            let temp = name.starts_with(TEMP_PREFIX);
            if !entry && !temp {
                continue;
            }
            // Gone since it was listed: another process evicted or
            // renamed it.
            let Ok(meta) = item.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if temp {
                let age = now.duration_since(modified).unwrap_or_default();
                if age >= STALE_TEMP_AGE {
                    if clean {
                        let _ = fs::remove_file(item.path());
                    }
                    continue;
                }
            }
            files.push(Counted {
                name: name.to_owned(),
                len: meta.len(),
                modified,
                entry,
            });
        }
        Ok(files)
    }

    fn scan_and_evict(&self) -> Result<Usage, StoreError> {
        // Writes counted before the scan lists the directory are in what
        // it finds; those counted while it runs may not be, and stay
        // counted.
        let counted = self.bound.scan_started();
        let mut files = self.scan(true)?;
        let mut bytes = files.iter().fold(0u64, |sum, f| sum.saturating_add(f.len));
        let mut evicted = 0;
        if bytes > self.max_bytes {
            let low_water = self.low_water_bytes();
            files.sort_by(|a, b| (a.modified, &a.name).cmp(&(b.modified, &b.name)));
            for file in files.iter_mut().filter(|f| f.entry) {
                if bytes <= low_water {
                    break;
                }
                match fs::remove_file(self.dir.join(&file.name)) {
                    // Gone already: another process evicted it.
                    Ok(()) => evicted += 1,
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    // Not this store's to delete, say: the next one is.
                    Err(e) => {
                        log::debug!("code store: evicting `{}` failed: {e}", file.name);
                        continue;
                    }
                }
                bytes = bytes.saturating_sub(file.len);
                file.entry = false;
                file.len = 0;
            }
        }
        self.bound.scanned(counted, bytes);
        Ok(Usage {
            entries: files.iter().filter(|f| f.entry).count() as u64,
            bytes,
            evicted,
        })
    }

    /// Counts `len` written bytes, and scans if the limit may be passed
    /// (see 3 in the module docs). Eviction errors are logged, not
    /// returned: the value was stored.
    fn account(&self, len: u64) {
        self.bound
            .account(len, false, self.max_bytes, &self.dir, || {
                self.scan_and_evict()
            });
    }
}

/// A file that counts towards a directory's size.
struct Counted {
    name: String,
    len: u64,
    modified: SystemTime,
    /// An entry (else a fresh temporary file, which is never evicted).
    entry: bool,
}

impl CodeStore for DirectoryStore {
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(key, u64::MAX)
    }

    /// Reads at most [`GET_MANY_BYTES`] in all (see 5 above): an entry
    /// whose length would take the bytes read past it is not read, and
    /// the call fails, so that each is asked for on its own.
    fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut read: u64 = 0;
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            let value = self.read(key, GET_MANY_BYTES - read)?;
            read += value.as_ref().map_or(0, |v| v.len() as u64);
            values.push(value);
        }
        Ok(values)
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        let len = value.len() as u64;
        let limit = self.low_water_bytes().min(MAX_ENTRY_BYTES);
        if len > limit {
            return Err(StoreError::TooLarge { len, limit });
        }
        let temp = match self.write_unnamed(key, value) {
            Some(named) => named?,
            None => self.write_temp(key, value)?,
        };
        if let Err(e) = fs::rename(&temp, self.path_of(key)) {
            let _ = fs::remove_file(&temp);
            return Err(self.io_error("rename", temp)(e));
        }
        self.account(len);
        Ok(())
    }
}

impl DirectoryStore {
    /// The entry of `key`, read if its file is no longer than `budget`
    /// bytes ([`StoreError::TooLarge`] otherwise, nothing read), with one
    /// open, one look at the opened file and one read (see 5 above); its
    /// time set to now if it was set more than [`TOUCH_AFTER`] ago.
    fn read(&self, key: &StoreKey, budget: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path_of(key);
        let mut file = match open_entry(&path) {
            Ok(Some(file)) => file,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.io_error("open", path)(e)),
        };
        // The file opened is looked at before anything is read (see 5
        // above): a regular file no longer than any entry.
        let opened = file
            .metadata()
            .map_err(self.io_error("open", path.clone()))?;
        if !opened.is_file() {
            return Err(self.io_error("open", path)(not_an_entry(
                "not a regular file",
            )));
        }
        if opened.len() > self.read_limit() {
            return Err(self.io_error("open", path)(not_an_entry(
                "longer than any entry a store writes",
            )));
        }
        if opened.len() > budget {
            return Err(StoreError::TooLarge {
                len: opened.len(),
                limit: budget,
            });
        }
        // Its length, read in one call (a file grown since is read no
        // further; one cut short since is an error: a miss).
        let mut value = vec![0; opened.len() as usize];
        file.read_exact(&mut value)
            .map_err(self.io_error("read", path.clone()))?;
        // Used now. Best effort (see 4 in the module docs).
        let now = SystemTime::now();
        let stale = opened
            .modified()
            .ok()
            .and_then(|set| now.duration_since(set).ok())
            .is_some_and(|age| age >= TOUCH_AFTER);
        if stale {
            let _ = file.set_modified(now);
        }
        Ok(Some(value))
    }

    /// The longest file `get` reads: no entry a store writes is longer
    /// than its low-water mark, and a directory may be shared by stores of
    /// other limits, up to the default one's; never more than
    /// [`MAX_ENTRY_BYTES`].
    fn read_limit(&self) -> u64 {
        self.low_water_bytes()
            .max(DEFAULT_LOW_WATER_BYTES)
            .min(MAX_ENTRY_BYTES)
    }

    /// `value` written to a temporary file for an entry of `key`, created
    /// by this call with its name (see [`create_own_file`]): its path.
    fn write_temp(&self, key: &StoreKey, value: &[u8]) -> Result<PathBuf, StoreError> {
        let (temp, mut file) = self.create_temp(key)?;
        if let Err(e) = write_entry(&mut file, value) {
            // The name is this store's own (it created the file).
            let _ = fs::remove_file(&temp);
            return Err(self.io_error("write", temp)(e));
        }
        Ok(temp)
    }

    /// `value` written to a file made without a name, then named as a
    /// temporary file for an entry of `key` (see 6 above): its path.
    /// `None` where the system makes no such file or cannot link it (no
    /// `/proc`, a link refused): nothing was stored, and the caller
    /// writes a named temporary file instead (as every later call does,
    /// once linking failed).
    fn write_unnamed(&self, key: &StoreKey, value: &[u8]) -> Option<Result<PathBuf, StoreError>> {
        static CANNOT_NAME: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        if CANNOT_NAME.load(Ordering::Relaxed) {
            return None;
        }
        let mut file = unnamed_file(&self.dir)?;
        if let Err(e) = write_entry(&mut file, value) {
            return Some(Err(self.io_error("write", self.dir.clone())(e)));
        }
        match under_own_name(
            &self.dir,
            |unique| temp_name(key, unique),
            |path| link_unnamed(&file, path),
        ) {
            Ok((path, ())) if is_same_file(&file, &path) => Some(Ok(path)),
            // Linked to another file: `/proc` is not what it should be.
            // The name, the store's own, goes; named files from now on.
            Ok((path, ())) => {
                let _ = fs::remove_file(&path);
                log::warn!("code store: `/proc/self/fd` does not lead to the files it names");
                CANNOT_NAME.store(true, Ordering::Relaxed);
                None
            }
            // The file's link in `/proc` is not there to follow, or the
            // system refuses such links: named files it is, from now on.
            Err((_, e)) if cannot_link_unnamed(&e) => {
                log::debug!("code store: unnamed files cannot be linked ({e}); named from now on");
                CANNOT_NAME.store(true, Ordering::Relaxed);
                None
            }
            Err((path, e)) => Some(Err(io_error("link", path)(e))),
        }
    }

    /// A temporary file for an entry of `key`, created by this call, and
    /// its path (see [`create_own_file`]).
    fn create_temp(&self, key: &StoreKey) -> Result<(PathBuf, File), StoreError> {
        create_own_file(&self.dir, |unique| temp_name(key, unique))
    }
}

/// Writes `value` to `file`, and sets its time to now, to the nanosecond
/// the clock gives (file systems otherwise round it to a tick), so that
/// eviction orders entries stored in one tick.
fn write_entry(file: &mut File, value: &[u8]) -> std::io::Result<()> {
    file.write_all(value)?;
    let _ = file.set_modified(SystemTime::now());
    Ok(())
}

/// The temporary name of an entry of `key`, from a part no other writer
/// uses.
fn temp_name(key: &StoreKey, unique: &str) -> String {
    format!("{TEMP_PREFIX}{}-{unique}", &key.hex()[..16])
}

/// On Linux, a file made in `dir` without a name (`O_TMPFILE`), for
/// reading and writing, where the file system makes such files; `None`
/// elsewhere. Making one does not lock the directory against lookups for
/// the time a file system takes to allocate it, as creating a named file
/// does (up to a millisecond on ext4 after many files were deleted,
/// during which every `get` of a missing entry in the directory waits: a
/// cold start in eager mode asks for each function it compiles).
#[cfg(target_os = "linux")]
fn unnamed_file(dir: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o666)
        .open(dir)
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn unnamed_file(_dir: &Path) -> Option<File> {
    None
}

/// Gives the unnamed `file` (see [`unnamed_file`]) the name `path`, a
/// name that must not exist (`linkat` of the file's `/proc/self/fd`
/// link, which it follows: the new name is not followed).
#[cfg(target_os = "linux")]
fn link_unnamed(file: &File, path: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::io::AsRawFd;
    let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let to = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: both are valid NUL-terminated strings that outlive the
    // call, and `linkat` reads nothing else of this process's memory.
    let linked = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if linked == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn link_unnamed(_file: &File, _path: &Path) -> std::io::Result<()> {
    // No unnamed files are made off Linux.
    Err(ErrorKind::Unsupported.into())
}

/// Whether `error`, from [`link_unnamed`], says that this system does not
/// link unnamed files (no `/proc`, a sandbox that refuses the link, a
/// file system that does not do it), rather than that this one link
/// failed (a full disk, say, which a named file would meet too).
fn cannot_link_unnamed(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::NotFound
            | ErrorKind::PermissionDenied
            | ErrorKind::Unsupported
            | ErrorKind::CrossesDevices
    )
}

/// Whether `path` names `file` itself (the same device and inode), not
/// following a link at `path`.
#[cfg(unix)]
fn is_same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(opened), Ok(named)) => (opened.dev(), opened.ino()) == (named.dev(), named.ino()),
        _ => false,
    }
}

#[cfg(not(unix))]
fn is_same_file(_file: &File, _path: &Path) -> bool {
    // No unnamed files are made off Linux.
    false
}

/// A part of a file's name that no other writer uses (see
/// [`under_own_name`]).
fn own_name_part() -> String {
    // A key drawn at random once: the names this process will make cannot
    // be told from those it made (so that no one can make them first).
    static KEY: OnceLock<RandomState> = OnceLock::new();
    let (pid, count) = (
        std::process::id(),
        NEXT_FILE.fetch_add(1, Ordering::Relaxed),
    );
    let unguessable = KEY.get_or_init(RandomState::new).hash_one((pid, count));
    format!("{pid}-{unguessable:016x}-{count}")
}

/// A file in `dir` created by this call (for reading and writing), named
/// by `name` from a part no other writer uses (see [`under_own_name`]),
/// and its path.
pub(super) fn create_own_file(
    dir: &Path,
    name: impl Fn(&str) -> String,
) -> Result<(PathBuf, File), StoreError> {
    under_own_name(dir, name, |path| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
    })
    .map_err(|(path, e)| io_error("create", path)(e))
}

/// What `make` makes at a path in `dir` named by `name` from a part no
/// other writer uses, and that path. That part holds the process id, a
/// keyed hash of it and a count (with a key drawn at random once in a
/// process, and kept by a child it forks, whose id differs: processes in
/// separate PID namespaces sharing the directory may have the same id,
/// and a writer to the directory who saw the names made so far cannot
/// tell the next ones, to make them first) and the count; should
/// `make` find a file of that name all the same, another name is tried,
/// up to 8 more (the existing file is someone else's, and is left alone).
/// On failure, the path last tried and `make`'s error.
fn under_own_name<T>(
    dir: &Path,
    name: impl Fn(&str) -> String,
    mut make: impl FnMut(&Path) -> std::io::Result<T>,
) -> Result<(PathBuf, T), (PathBuf, std::io::Error)> {
    let mut attempts = 0;
    loop {
        let path = dir.join(name(&own_name_part()));
        match make(&path) {
            Ok(made) => return Ok((path, made)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err((path, e)),
        }
    }
}

/// Opens the file at `path` for reading without following a link there,
/// and without waiting on a FIFO (on Unix: `O_NOFOLLOW | O_NONBLOCK`;
/// elsewhere, a link or a file that is not regular is refused by looking
/// first, and a swap in between is not guarded against). `None` if there
/// is no file.
pub(super) fn open_entry(path: &Path) -> std::io::Result<Option<File>> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    #[cfg(not(unix))]
    match fs::symlink_metadata(path) {
        Ok(metadata) if !metadata.is_file() => return Err(not_an_entry("not a regular file")),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    match options.open(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        // A link, refused by `O_NOFOLLOW`.
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(not_an_entry("a link")),
        Err(e) => Err(e),
    }
}

/// A [`StoreError::Io`] of `operation` on `path`, from its cause.
pub(super) fn io_error(
    operation: &'static str,
    path: PathBuf,
) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io {
        operation,
        path,
        source,
    }
}

/// The error of a file under an entry's name that cannot be one.
fn not_an_entry(why: &'static str) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, why)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::{link_unnamed, temp_name, unnamed_file, write_entry};
    use crate::store::StoreKey;

    /// On Linux, an entry is written into a file the directory does not
    /// list until it is linked under its temporary name (see 6 in the
    /// module docs); the name is not replaced if it exists.
    #[test]
    fn an_unnamed_file_is_listed_only_once_linked() {
        let dir = std::env::temp_dir().join(format!("jitfold-unnamed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listed = || std::fs::read_dir(&dir).unwrap().count();
        // Nothing to test where the file system makes no unnamed files
        // (the store then creates named ones).
        let Some(mut file) = unnamed_file(&dir) else {
            return;
        };
        write_entry(&mut file, b"entry").unwrap();
        assert_eq!(listed(), 0);
        let key = StoreKey::from_bytes([7; 16]);
        let path = dir.join(temp_name(&key, "test"));
        match link_unnamed(&file, &path) {
            Ok(()) => {}
            // No `/proc`, or a sandbox: the store names its files.
            Err(e) if super::cannot_link_unnamed(&e) => return,
            Err(e) => panic!("{e}"),
        }
        assert!(super::is_same_file(&file, &path));
        assert_eq!(listed(), 1);
        assert_eq!(std::fs::read(&path).unwrap(), b"entry");
        let kind = link_unnamed(&file, &path).unwrap_err().kind();
        assert_eq!(kind, std::io::ErrorKind::AlreadyExists);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
