//! A code store behind `DedupModule`: a warm start compiles nothing and
//! every function returns what plain `JITModule` returns; entries that do
//! not check out, and a store that fails, cost compilations, never an
//! error or wrong code.

use crate::common;

use crate::common::build::{call1, declare, leaves_and_callers};
use cranelift_codegen::ir::InstBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Module, default_libcall_names};
use jitfold::store::{
    CodeContext, CodeStore, DirectoryStore, Entry, GET_MANY_CHUNK, MemoryStore, PackStore, Secret,
    SharedStore, StoreError, StoreKey,
};
use jitfold::{DedupModule, DedupOptions, Fingerprint, Stats};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Leaves with distinct constants (distinct templates), and one caller of
/// each (one template: code reuse within a run).
const LEAVES: i64 = 6;

/// Builds the program in `m`, declaring in reverse order when `reverse`
/// (other ids, other names in each function's name table); returns the
/// ids in one order whatever the declaration order.
fn build<M: Module>(m: &mut M, reverse: bool) -> Vec<FuncId> {
    let mut order: Vec<i64> = (0..LEAVES).collect();
    if reverse {
        order.reverse();
    }
    leaves_and_callers(m, &order, 100)
}

/// Every function called with a few inputs.
fn results(ptr: impl Fn(FuncId) -> *const u8, ids: &[FuncId]) -> Vec<i64> {
    let mut out = Vec::new();
    for &id in ids {
        for x in [-7, 0, 5, 1 << 40] {
            out.push(call1(ptr(id), x));
        }
    }
    out
}

fn builder() -> JITBuilder {
    JITBuilder::new(default_libcall_names()).unwrap()
}

/// What plain `JITModule` returns.
fn plain() -> Vec<i64> {
    let mut m = JITModule::new(builder());
    let ids = build(&mut m, false);
    m.finalize_definitions().unwrap();
    results(|id| m.get_finalized_function(id), &ids)
}

/// One run through jitfold with `store` (and `secret`): its statistics and
/// results.
fn run(
    store: Arc<dyn CodeStore>,
    secret: Option<Secret>,
    options: DedupOptions,
    reverse: bool,
) -> (Stats, Vec<i64>) {
    let mut m = DedupModule::with_options(builder(), options).with_store(store, secret);
    let ids = build(&mut m, reverse);
    m.finalize_definitions().unwrap();
    let out = results(|id| m.get_finalized_function(id), &ids);
    // Entries are written behind the flush; a run ends once they are.
    m.wait_for_store_writes();
    (m.stats().clone(), out)
}

/// A fresh, empty directory for a store.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("jitfold-persistent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The entry files of a directory store.
fn entry_files(dir: &PathBuf) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    files.sort();
    files
}

#[test]
fn a_second_run_compiles_nothing_and_returns_the_same_results() {
    let expected = plain();
    let dir = scratch("warm");
    let store: Arc<dyn CodeStore> = Arc::new(DirectoryStore::new(&dir).unwrap());
    let (cold, out) = run(store.clone(), None, DedupOptions::default(), false);
    assert_eq!(out, expected);
    // The leaves and one caller are compiled; the other callers reuse it.
    assert_eq!(cold.compiled, LEAVES as u64 + 1, "{cold}");
    assert_eq!(cold.loaded, 0);
    assert_eq!(cold.store_writes, cold.compiled);
    assert_eq!(entry_files(&dir).len() as u64, cold.compiled);

    // Declared in the other order: other ids and name tables.
    let (warm, out) = run(store.clone(), None, DedupOptions::default(), true);
    assert_eq!(out, expected);
    assert_eq!(warm.compiled, 0, "{warm}");
    assert_eq!(warm.loaded, LEAVES as u64 + 1);
    assert_eq!(warm.reused, LEAVES as u64 - 1);
    assert_eq!(warm.store_rejected + warm.store_errors, 0);

    // Batch mode and check mode read the same entries.
    for options in [
        DedupOptions::batch(),
        DedupOptions::batch().with_threads(2),
        DedupOptions::default().with_check(true),
    ] {
        let (warm, out) = run(store.clone(), None, options, false);
        assert_eq!(out, expected);
        assert_eq!(warm.compiled, 0, "{options}: {warm}");
        // Nothing was compiled on threads only to be dropped.
        assert_eq!(warm.parallel_discarded, 0, "{options}: {warm}");
        assert_eq!(warm.store_rejected, 0, "{options}: {warm}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Eager mode sends its entries to a store that reserves nothing a few
/// dozen at a time: what waits is sent to the writer by the next flush, or
/// written when the module is dropped without one.
#[test]
fn entries_waiting_to_be_sent_are_written_when_the_module_drops() {
    let expected = plain();
    let dir = scratch("drop");
    let store = || -> Arc<dyn CodeStore> { Arc::new(PackStore::new(&dir).unwrap()) };
    {
        let mut m =
            DedupModule::with_options(builder(), DedupOptions::eager()).with_store(store(), None);
        build(&mut m, false);
        assert!(m.stats().compiled > 0);
        // Dropped unfinalized.
    }
    let (warm, out) = run(store(), None, DedupOptions::eager(), false);
    assert_eq!(out, expected);
    assert_eq!(warm.compiled, 0, "{warm}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pack store, opened afresh for each run as a new process would: the
/// warm runs in every mode compile nothing, load what the cold run wrote
/// (in one pack) and return what plain `JITModule` returns.
#[test]
fn a_pack_store_serves_warm_starts_in_every_mode() {
    let expected = plain();
    let dir = scratch("pack");
    let store = || -> Arc<dyn CodeStore> { Arc::new(PackStore::new(&dir).unwrap()) };
    let (cold, out) = run(store(), None, DedupOptions::default(), false);
    assert_eq!(out, expected);
    assert_eq!(cold.store_writes, cold.compiled);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    for options in [
        DedupOptions::default(),
        DedupOptions::batch(),
        DedupOptions::batch().with_threads(2),
    ] {
        let (warm, out) = run(store(), None, options, true);
        assert_eq!(out, expected);
        assert_eq!(warm.compiled, 0, "{options}: {warm}");
        assert_eq!(warm.loaded, cold.compiled, "{options}: {warm}");
        assert_eq!(
            warm.store_rejected + warm.store_errors,
            0,
            "{options}: {warm}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corrupt_entries_are_rejected_compiled_and_written_again() {
    let expected = plain();
    let dir = scratch("corrupt");
    let store: Arc<dyn CodeStore> = Arc::new(DirectoryStore::new(&dir).unwrap());
    let (cold, _) = run(store.clone(), None, DedupOptions::default(), false);
    let files = entry_files(&dir);
    assert_eq!(files.len() as u64, cold.compiled);
    // One entry truncated, one with a byte flipped in its code, one
    // replaced by another entry (stored under another entry's key).
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() / 2]).unwrap();
    let mut flipped = std::fs::read(&files[1]).unwrap();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    std::fs::write(&files[1], flipped).unwrap();
    std::fs::copy(&files[3], &files[2]).unwrap();

    let (after, out) = run(store.clone(), None, DedupOptions::default(), false);
    assert_eq!(out, expected);
    assert_eq!(after.store_rejected, 3, "{after}");
    assert_eq!(after.compiled, 3, "{after}");
    assert_eq!(after.loaded, cold.compiled - 3);
    // Written again: the next run loads everything.
    let (again, out) = run(store, None, DedupOptions::default(), false);
    assert_eq!(out, expected);
    assert_eq!((again.compiled, again.store_rejected), (0, 0), "{again}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A store in memory that counts how it is asked.
#[derive(Default)]
struct Counting {
    inner: MemoryStore,
    /// `get`s (and so `get_or_reserve`s).
    gets: AtomicUsize,
    /// The number of keys of each `get_many`.
    many: Mutex<Vec<usize>>,
    /// Which `get_many` since the last [`Counting::take`] fails, counting
    /// from 1 (0: none).
    failing_many: AtomicUsize,
}

impl CodeStore for Counting {
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key)
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, value)
    }

    fn get_many(&self, keys: &[StoreKey]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut many = self.many.lock().unwrap();
        many.push(keys.len());
        if many.len() == self.failing_many.load(Ordering::Relaxed) {
            return Err(down());
        }
        self.inner.get_many(keys)
    }
}

impl Counting {
    /// What it counted since the last call, and starts again.
    fn take(&self) -> (usize, Vec<usize>) {
        (
            self.gets.swap(0, Ordering::Relaxed),
            std::mem::take(&mut *self.many.lock().unwrap()),
        )
    }
}

/// A batch flush asks for at most [`GET_MANY_CHUNK`] keys at a time (the
/// keys of the functions walked so far, while it records the rest, then
/// the rest): a call that fails costs only its own keys a lookup each, and
/// what the other calls fetched is used.
#[test]
fn a_failed_chunk_of_a_batch_lookup_loses_only_its_own_keys() {
    let order: Vec<i64> = (0..GET_MANY_CHUNK as i64 + 20).collect();
    let templates = order.len() + 1;
    let store = Arc::new(Counting::default());
    let run = || {
        let mut m = DedupModule::with_options(builder(), DedupOptions::batch())
            .with_store(store.clone(), None);
        leaves_and_callers(&mut m, &order, 100);
        m.finalize_definitions().unwrap();
        m.stats().clone()
    };
    let cold = run();
    assert_eq!(cold.compiled as usize, templates, "{cold}");
    // Every template asked for once, in calls of at most a chunk each,
    // and none on its own.
    let (gets, chunks) = store.take();
    assert_eq!(gets, 0);
    assert!(chunks.len() >= 2, "{chunks:?}");
    assert!(
        chunks.iter().all(|&n| (1..=GET_MANY_CHUNK).contains(&n)),
        "{chunks:?}"
    );
    assert_eq!(chunks.iter().sum::<usize>(), templates);
    // The first call fails: the others are still made, and only the first
    // chunk's keys are asked again, one by one.
    store.failing_many.store(1, Ordering::Relaxed);
    let warm = run();
    assert_eq!(
        (warm.compiled, warm.loaded as usize, warm.store_errors),
        (0, templates, 1),
        "{warm}"
    );
    assert_eq!(store.take(), (chunks[0], chunks));
}

/// A batch flush on one thread asks for its entries while it records:
/// the keys of the functions walked so far travel to the store before the
/// flush begins, and each template is asked for once in all, what was
/// fetched ahead loaded as any entry is.
#[test]
fn a_batch_flush_fetches_its_entries_while_it_records() {
    let order: Vec<i64> = (0..200).collect();
    let templates = order.len() + 1;
    let store = Arc::new(Counting::default());
    let module = || {
        DedupModule::with_options(builder(), DedupOptions::batch()).with_store(store.clone(), None)
    };
    let mut cold = module();
    leaves_and_callers(&mut cold, &order, 100);
    cold.finalize_definitions().unwrap();
    drop(cold);
    store.take();
    let mut warm = module();
    leaves_and_callers(&mut warm, &order, 100);
    // Recorded, not flushed: the module's fetcher, a thread of its own,
    // has been sent the keys walked so far (waited for, not timed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while store.many.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let asked_ahead: usize = store.many.lock().unwrap().iter().sum();
    assert!((1..templates).contains(&asked_ahead), "{asked_ahead}");
    warm.finalize_definitions().unwrap();
    let stats = warm.stats();
    assert_eq!(
        (stats.compiled, stats.loaded as usize),
        (0, templates),
        "{stats}"
    );
    let (gets, chunks) = store.take();
    assert_eq!(gets, 0);
    assert_eq!(chunks.iter().sum::<usize>(), templates, "{chunks:?}");
}

/// A flush asks the store ahead only for what its define would ask for:
/// a function whose template the module compiled before (whose code it
/// reuses) is never asked for.
#[test]
fn a_batch_flush_asks_nothing_for_code_the_module_holds() {
    use crate::common::build::{define, emit_call};
    let store = Arc::new(Counting::default());
    let mut m =
        DedupModule::with_options(builder(), DedupOptions::batch()).with_store(store.clone(), None);
    let order: Vec<i64> = (0..100).collect();
    leaves_and_callers(&mut m, &order, 100);
    m.flush().unwrap();
    let (gets, chunks) = store.take();
    assert_eq!((gets, chunks.iter().sum::<usize>()), (0, order.len() + 1));
    // New leaves (a template each), and a caller of each: the callers'
    // template again, whose code the module holds.
    let conv = m.isa().default_call_conv();
    for k in order.iter().copied() {
        let leaf = declare(&mut m, &format!("new_leaf{k}"), conv);
        let caller = declare(&mut m, &format!("new_caller{k}"), conv);
        define(&mut m, leaf, |b, _, p| {
            let t = b.ins().imul_imm_s(p[0], 3 + k);
            let r = b.ins().iadd_imm_s(t, 1000 * k + 7);
            b.ins().return_(&[r]);
        })
        .unwrap();
        define(&mut m, caller, |b, m, p| {
            let one = b.ins().iconst(cranelift_codegen::ir::types::I64, 1);
            let x = b.ins().iadd(p[0], one);
            let r = emit_call(b, m, leaf, x);
            b.ins().return_(&[r]);
        })
        .unwrap();
    }
    m.flush().unwrap();
    let stats = m.stats().clone();
    assert_eq!(stats.reused as usize, 2 * (order.len() - 1) + 1, "{stats}");
    // Only the new leaves' templates were asked for.
    let (gets, chunks) = store.take();
    assert_eq!((gets, chunks.iter().sum::<usize>()), (0, order.len()));
}

/// On an ISA without trampolines (riscv64), where planning walks nothing,
/// a batch flush still asks the store once, for every function.
#[cfg(feature = "all-targets")]
#[test]
fn a_batch_flush_asks_the_store_once_on_an_isa_without_trampolines() {
    use cranelift_object::{ObjectBuilder, ObjectModule};
    let store = Arc::new(Counting::default());
    let run = || {
        let isa = jitfold::isa::isa_by_name("riscv64", jitfold::isa::flags(&[]).unwrap()).unwrap();
        let builder = ObjectBuilder::new(isa, "riscv", default_libcall_names()).unwrap();
        let mut m = DedupModule::wrap(ObjectModule::new(builder), DedupOptions::batch())
            .with_store(store.clone(), None);
        leaves_and_callers(&mut m, &(0..LEAVES).collect::<Vec<_>>(), 100);
        m.flush().unwrap();
        let stats = m.stats().clone();
        m.finish();
        stats
    };
    let templates = LEAVES as usize + 1;
    let cold = run();
    assert_eq!(cold.compiled as usize, templates, "{cold}");
    assert_eq!(store.take(), (0, vec![templates]));
    let warm = run();
    assert_eq!(
        (warm.compiled, warm.loaded as usize),
        (0, templates),
        "{warm}"
    );
    assert_eq!(store.take(), (0, vec![templates]));
}

/// A flush of fewer than [`GET_MANY_CHUNK`] functions asks the store in
/// one call.
#[test]
fn a_small_batch_flush_asks_the_store_once_for_all_its_functions() {
    let expected = plain();
    let store = Arc::new(Counting::default());
    // The templates that need code: the leaves and one caller's.
    let templates = LEAVES as usize + 1;
    let (cold, out) = run(store.clone(), None, DedupOptions::batch(), false);
    assert_eq!(out, expected);
    assert_eq!(cold.compiled as usize, templates, "{cold}");
    // One batched lookup finds nothing, and nothing is asked again.
    assert_eq!(store.take(), (0, vec![templates]));
    for options in [DedupOptions::batch(), DedupOptions::batch().with_threads(2)] {
        let (warm, out) = run(store.clone(), None, options, true);
        assert_eq!(out, expected);
        assert_eq!(
            (warm.compiled, warm.loaded as usize),
            (0, templates),
            "{options}: {warm}"
        );
        // No lookup of its own: one batched lookup served them all (and,
        // on threads, told which not to compile).
        assert_eq!(store.take(), (0, vec![templates]), "{options}");
    }
    // Eager mode asks for each function as it comes.
    let (warm, _) = run(store.clone(), None, DedupOptions::eager(), false);
    assert_eq!(warm.loaded as usize, templates);
    assert_eq!(store.take(), (templates, vec![]));
    // A store that reserves is asked again for what the batch did not
    // find, and so reserves each template compiled.
    let shared = Arc::new(SharedStore::new());
    let (cold, out) = run(shared.clone(), None, DedupOptions::batch(), false);
    assert_eq!(out, expected);
    assert_eq!(cold.compiled as usize, templates, "{cold}");
    assert_eq!(shared.stats().reservations as usize, templates);
}

/// A store whose writes wait until the test opens its gate (or ten
/// seconds pass), in front of a memory store.
#[derive(Default)]
struct Gated {
    inner: MemoryStore,
    open: Mutex<bool>,
    opened: std::sync::Condvar,
    /// Writes begun, and writes done.
    begun: AtomicUsize,
    done: AtomicUsize,
}

impl Gated {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl CodeStore for Gated {
    fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }

    fn put(&self, key: &StoreKey, value: &[u8]) -> Result<(), StoreError> {
        self.begun.fetch_add(1, Ordering::SeqCst);
        let open = self.open.lock().unwrap();
        let _open = self
            .opened
            .wait_timeout_while(open, std::time::Duration::from_secs(10), |open| !*open)
            .unwrap();
        let put = self.inner.put(key, value);
        self.done.fetch_add(1, Ordering::SeqCst);
        put
    }
}

/// A flush does not wait for its entries to be written (a cold start is
/// not slower for a slow store): in every mode, `finalize_definitions`
/// returns while the store's first write is still held, with every
/// function callable and no write counted yet; `wait_for_store_writes`
/// then waits for all of them and counts them, and a second module finds
/// every entry.
#[test]
fn a_flush_does_not_wait_for_its_entries_to_be_written() {
    let expected = plain();
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        let store = Arc::new(Gated::default());
        let mut m = DedupModule::with_options(builder(), options).with_store(store.clone(), None);
        let ids = build(&mut m, false);
        m.finalize_definitions().unwrap();
        assert_eq!(results(|id| m.get_finalized_function(id), &ids), expected);
        // Held at the gate, which only the test opens.
        assert_eq!(store.done.load(Ordering::SeqCst), 0, "{options:?}");
        assert_eq!(m.stats().store_writes, 0, "{options:?}");
        store.open();
        m.wait_for_store_writes();
        let compiled = m.stats().compiled;
        assert_eq!(m.stats().store_writes, compiled, "{options:?}");
        assert!(store.begun.load(Ordering::SeqCst) >= 1, "{options:?}");
        drop(m);
        let (warm, out) = run(store.clone(), None, options, false);
        assert_eq!(out, expected);
        assert_eq!(
            (warm.compiled, warm.loaded),
            (0, compiled),
            "{options:?}: {warm}"
        );
    }
}

/// A store that is down.
struct Down;

impl CodeStore for Down {
    fn get(&self, _: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        Err(down())
    }

    fn put(&self, _: &StoreKey, _: &[u8]) -> Result<(), StoreError> {
        Err(down())
    }
}

fn down() -> StoreError {
    StoreError::Io {
        operation: "read",
        path: PathBuf::from("/down"),
        source: std::io::Error::other("down for the test"),
    }
}

#[test]
fn a_store_that_fails_is_a_miss_not_an_error() {
    let expected = plain();
    let (stats, out) = run(Arc::new(Down), None, DedupOptions::default(), false);
    assert_eq!(out, expected);
    assert_eq!(stats.compiled, LEAVES as u64 + 1);
    // Each compiled function: a failed lookup, and its entry a failed
    // write (the writer thread joins the entries waiting together into
    // one write, which fails once).
    let write_errors = |stats: &jitfold::Stats, lookups: u64| stats.store_errors - lookups;
    assert!(
        (1..=stats.compiled).contains(&write_errors(&stats, stats.compiled)),
        "{stats}"
    );
    assert_eq!(stats.loaded + stats.store_writes, 0);
    // In batch mode, the flush's batched lookup (one: fewer templates than
    // a request of keys asked ahead holds, 5 in `src/module/stored.rs`)
    // fails first; each function then asks on its own; the entries are
    // sent 32 at a time (9 there), each write failing once.
    let (stats, out) = run(Arc::new(Down), None, DedupOptions::batch(), false);
    assert_eq!(out, expected);
    assert_eq!(stats.compiled, LEAVES as u64 + 1);
    let writes = stats.compiled.div_ceil(32);
    assert!(
        (1..=writes).contains(&write_errors(&stats, 1 + stats.compiled)),
        "{stats}"
    );
    assert_eq!(stats.loaded + stats.store_writes, 0);
}

#[test]
fn with_a_secret_only_entries_signed_with_it_are_used() {
    let expected = plain();
    let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
    let secret = || Some(Secret::derive(b"the fleet's key"));
    let (unsigned, _) = run(store.clone(), None, DedupOptions::default(), false);
    // Unsigned entries are not used with a secret (and are replaced by
    // signed ones).
    let (signed, out) = run(store.clone(), secret(), DedupOptions::default(), false);
    assert_eq!(out, expected);
    assert_eq!(signed.store_rejected, unsigned.compiled, "{signed}");
    assert_eq!(signed.loaded, 0);
    let (warm, out) = run(store.clone(), secret(), DedupOptions::default(), false);
    assert_eq!(out, expected);
    assert_eq!(
        (warm.compiled, warm.loaded),
        (0, unsigned.compiled),
        "{warm}"
    );
    // Another key: nothing is used.
    let other = Some(Secret::derive(b"an attacker's key"));
    let (foreign, out) = run(store, other, DedupOptions::default(), false);
    assert_eq!(out, expected);
    assert_eq!(foreign.loaded, 0, "{foreign}");
    assert_eq!(foreign.store_rejected, unsigned.compiled);
}

/// An entry for `leaf0`'s template holding the code of `leaf1`, as a
/// writer to an unsigned store could make it.
fn planted_store() -> Arc<MemoryStore> {
    let mut m = JITModule::new(builder());
    let conv = m.isa().default_call_conv();
    let ids: Vec<FuncId> = (0..2)
        .map(|k| declare(&mut m, &format!("leaf{k}"), conv))
        .collect();
    let leaf = |m: &mut JITModule, k: i64| {
        common::build::built(m, ids[k as usize], |b, _, p| {
            let t = b.ins().imul_imm_s(p[0], 3 + k);
            let r = b.ins().iadd_imm_s(t, 100 * k);
            b.ins().return_(&[r]);
        })
    };
    let (leaf0, leaf1) = (leaf(&mut m, 0), leaf(&mut m, 1));
    let template = Fingerprint::of(&leaf0).to_template();
    let code = jitfold::compile::compile(&leaf1, m.isa()).unwrap();
    let entry = Entry::new(&template, &[], &code.code, code.time, None).unwrap();
    store_holding(m.isa(), &template, &entry)
}

/// A store in memory holding `entry`, unsigned, for `template` compiled
/// by `isa`.
fn store_holding(
    isa: &dyn cranelift_codegen::isa::TargetIsa,
    template: &jitfold::Template,
    entry: &Entry,
) -> Arc<MemoryStore> {
    let context = CodeContext::of(isa);
    let store = Arc::new(MemoryStore::new());
    store
        .put(
            &StoreKey::of(&context, template),
            &entry.encode(&context, None),
        )
        .unwrap();
    store
}

#[test]
fn check_mode_uses_an_entry_only_if_it_is_the_functions_own_code() {
    let expected = plain();
    // Without check mode, the planted entry is trusted: leaf0 runs leaf1's
    // code (what the trust model says a writer to an unsigned store can do).
    let (trusting, out) = run(planted_store(), None, DedupOptions::default(), false);
    assert_eq!(trusting.loaded, 1, "{trusting}");
    assert_ne!(out, expected);
    // Check mode compiles leaf0 on its own, sees other code, and compiles.
    let check = DedupOptions::default().with_check(true);
    let (checked, out) = run(planted_store(), None, check, false);
    assert_eq!(out, expected);
    assert_eq!(
        (checked.loaded, checked.store_rejected),
        (0, 1),
        "{checked}"
    );
}

/// A function whose constant pool maps bytes to handles otherwise than its
/// handles say has a key unique only within its process (see
/// `fingerprint::an_irregular_constant_pool_merges_with_nothing`): the
/// store is never asked for it, in either mode, while a function with a
/// regular pool is.
#[test]
fn the_store_is_never_asked_for_a_function_with_a_stale_constant_pool() {
    use cranelift_codegen::ir::{ConstantData, UserFuncName};
    for stale in [false, true] {
        #[allow(unused_mut)]
        let mut batches = vec![DedupOptions::batch(), DedupOptions::batch().with_threads(2)];
        // (The fuzzer's similar-merging options, which merge anything.)
        #[cfg(feature = "fuzzing")]
        batches.push(jitfold::fuzzing::differential::similar_options());
        for options in [DedupOptions::eager()].into_iter().chain(batches) {
            let store = Arc::new(Counting::default());
            let mut m =
                DedupModule::with_options(builder(), options).with_store(store.clone(), None);
            let conv = m.isa().default_call_conv();
            let id = declare(&mut m, "f", conv);
            let mut ctx = m.make_context();
            ctx.func = crate::common::build::built(&mut m, id, |b, _, p| {
                b.ins().return_(&[p[0]]);
            });
            ctx.func.name = UserFuncName::user(0, id.as_u32());
            ctx.func
                .dfg
                .constants
                .insert(ConstantData::from(vec![1u8; 16]));
            if stale {
                for data in ctx.func.dfg.constants.entries_mut() {
                    *data = ConstantData::from(vec![2u8; 16]);
                }
            }
            m.define_function(id, &mut ctx).unwrap();
            m.finalize_definitions().unwrap();
            m.wait_for_store_writes();
            let (gets, many) = store.take();
            let asked = gets + many.iter().sum::<usize>();
            assert_eq!(asked, usize::from(!stale), "{options}, stale {stale}");
            // Nor is its code stored: it would never be loaded.
            assert_eq!(
                m.stats().store_writes,
                u64::from(!stale),
                "{options}, stale {stale}"
            );
        }
    }
}

/// `leaf` of [`planted_with`]: returns its argument times 7.
fn leaf7<M: Module>(m: &mut M, id: FuncId) -> cranelift_codegen::ir::Function {
    common::build::built(m, id, |b, _, p| {
        let r = b.ins().imul_imm_s(p[0], 7);
        b.ins().return_(&[r]);
    })
}

/// A store holding an entry for [`leaf7`]'s template: its own code for
/// `isa` (with its unwind information), changed by `alter`.
fn planted_with(
    isa: &cranelift_codegen::isa::OwnedTargetIsa,
    alter: impl FnOnce(&mut jitfold::code::MachineCode),
) -> Arc<MemoryStore> {
    let builder =
        cranelift_object::ObjectBuilder::new(isa.clone(), "plant", default_libcall_names());
    let mut m = cranelift_object::ObjectModule::new(builder.unwrap());
    let id = declare(&mut m, "leaf", isa.default_call_conv());
    let func = leaf7(&mut m, id);
    let template = Fingerprint::of(&func).to_template();
    let mut ctx = cranelift_codegen::Context::for_function(func);
    ctx.compile(&**isa, &mut Default::default()).unwrap();
    let mut code = jitfold::code::MachineCode::of(&ctx).unwrap();
    // (None where the ISA has no unwind information to give.)
    let unwind = ctx
        .compiled_code()
        .unwrap()
        .create_unwind_info(&**isa)
        .ok()
        .flatten();
    alter(&mut code);
    let entry = Entry::new(&template, &[], &code, Default::default(), unwind.as_ref()).unwrap();
    store_holding(&**isa, &template, &entry)
}

/// An alteration for [`planted_with`]: one more relocation, of `kind`, at
/// the start of the code (to the code's own start).
fn with_reloc(
    kind: cranelift_codegen::binemit::Reloc,
) -> impl FnOnce(&mut jitfold::code::MachineCode) {
    move |code| {
        code.relocs.push(jitfold::code::Relocation {
            offset: 0,
            kind,
            addend: 0,
            target: jitfold::code::RelocTarget::OwnOffset(0),
        });
    }
}

/// Defines [`leaf7`] in a module made by `make` with `store`: the
/// statistics (loaded, rejected, compiled).
fn define_leaf7<M: Module>(
    m: DedupModule<M>,
    store: Arc<MemoryStore>,
) -> (DedupModule<M>, (u64, u64, u64)) {
    let mut m = m.with_store(store, None);
    let conv = m.isa().default_call_conv();
    let id = declare(&mut m, "leaf", conv);
    let mut ctx = m.make_context();
    ctx.func = leaf7(&mut m, id);
    m.define_function(id, &mut ctx).unwrap();
    let stats = m.stats();
    let counts = (stats.loaded, stats.store_rejected, stats.compiled);
    (m, counts)
}

/// An entry whose code asks for an alignment a compile for this ISA never
/// gives (below the flags' minimum, or beyond what constants ask: the
/// JIT's memory would overrun its region) is rejected and the function
/// compiled; the same code with the alignment a compile gives is used.
#[test]
fn an_entry_with_an_alignment_no_compile_gives_is_rejected() {
    let flags = jitfold::isa::flags(&[("log2_min_function_alignment", "5")]).unwrap();
    let isa = jitfold::isa::host_isa(flags).unwrap();
    for (alignment, used) in [(16, false), (32, true), (1 << 20, false)] {
        let store = planted_with(&isa, |code| {
            assert_eq!(code.alignment, 32);
            code.alignment = alignment;
        });
        let builder = JITBuilder::with_isa(isa.clone(), default_libcall_names());
        let (mut m, counts) = define_leaf7(
            DedupModule::with_options(builder, DedupOptions::default()),
            store,
        );
        assert_eq!(
            counts,
            if used { (1, 0, 0) } else { (0, 1, 1) },
            "alignment {alignment}"
        );
        m.finalize_definitions().unwrap();
        let id = m.get_name("leaf").unwrap();
        let cranelift_module::FuncOrDataId::Func(id) = id else {
            unreachable!()
        };
        assert_eq!(call1(m.get_finalized_function(id), 6), 42);
    }
}

/// An entry with a relocation of a kind no compile for this architecture
/// emits (one the JIT would panic on at finalize, cranelift-object when it
/// is defined) is rejected and the function compiled, in either module.
#[test]
fn an_entry_with_a_relocation_of_another_architecture_is_rejected() {
    use cranelift_codegen::binemit::Reloc;
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    // Unaltered, the entry is used (so the rejections are the relocations').
    let builder = || JITBuilder::with_isa(isa.clone(), default_libcall_names());
    let jit = || DedupModule::with_options(builder(), DedupOptions::default());
    let (_, counts) = define_leaf7(jit(), planted_with(&isa, |_| {}));
    assert_eq!(counts, (1, 0, 0));
    // Of no backend; of another architecture; through a GOT without
    // `is_pic` (which the JIT panics on); of another TLS model.
    let foreign = [
        Reloc::Arm32Call,
        Reloc::Aarch64AdrPrelPgHi21,
        Reloc::X86GOTPCRel4,
        Reloc::X86SecRel,
    ];
    for kind in foreign {
        let (mut m, counts) = define_leaf7(jit(), planted_with(&isa, with_reloc(kind)));
        assert_eq!(counts, (0, 1, 1), "{kind:?}");
        m.finalize_definitions().unwrap();
        let object =
            cranelift_object::ObjectBuilder::new(isa.clone(), "foreign", default_libcall_names())
                .unwrap();
        let m = DedupModule::<cranelift_object::ObjectModule>::new(object);
        let (m, counts) = define_leaf7(m, planted_with(&isa, with_reloc(kind)));
        assert_eq!(counts, (0, 1, 1), "{kind:?}");
        m.finish().emit().unwrap();
    }
}

/// An entry the inner module panics on when it is defined (a relocation of
/// a kind the ISA emits, but that cranelift-object cannot express in the
/// object's format: a near address on aarch64 in COFF) is not used: the
/// function is compiled.
#[test]
fn an_entry_the_inner_module_panics_on_is_not_used() {
    let flags = jitfold::isa::flags(&[]).unwrap();
    let isa = jitfold::isa::isa_by_name("aarch64-pc-windows-msvc", flags).unwrap();
    let object = || {
        let builder =
            cranelift_object::ObjectBuilder::new(isa.clone(), "coff", default_libcall_names());
        DedupModule::<cranelift_object::ObjectModule>::new(builder.unwrap())
    };
    let (_, counts) = define_leaf7(object(), planted_with(&isa, |_| {}));
    assert_eq!(counts, (1, 0, 0));
    let (m, counts) = define_leaf7(
        object(),
        planted_with(
            &isa,
            with_reloc(cranelift_codegen::binemit::Reloc::Aarch64AdrPrelPgHi21),
        ),
    );
    assert_eq!(counts, (0, 1, 1));
    m.finish().emit().unwrap();
}
