//! Compile once across runs and processes: a function to be compiled is
//! first looked up in a [code store](crate::store), and what is compiled
//! is stored for later runs.
//!
//! # What this module guarantees
//!
//! 1. An entry is used only if it passes every check of the one load path,
//!    [`crate::store::load`]: it decodes for this module's ISA, flags and
//!    versions ([`CodeContext`]), for this function's template (a key
//!    collision is a miss), with a valid MAC when a secret is set, its
//!    relocations retarget to the function's names, and its code is
//!    aligned and relocated as a compile for this ISA can give; anything
//!    else is a miss, counted in [`crate::Stats`] (`store_rejected`), and
//!    the function is compiled and its entry written again. A store that
//!    fails (down, slow, full) is a miss too (`store_errors`): it is never
//!    an error of the JIT's user. A key the store reserved for this module
//!    is held as a [`Reservation`], which ends with the `put` of what is
//!    compiled or, dropped, releases the key.
//! 2. Code from an entry is copied into the inner module
//!    (`define_function_bytes`), never run in place, after the function is
//!    verified as code that is not compiled always is. In check mode it is
//!    used only if it is byte for byte the function's own compilation.
//! 3. An entry whose unwind information was left out (built without the
//!    `store-unwind` feature) is not used where the inner module may write
//!    frame descriptions of code defined from bytes (see
//!    [`DedupModule::with_store`]), so no function loses its frame.
//! 4. Code loaded from an entry is kept as a code template of this module
//!    where compiling the function would keep its code (its plan keeps
//!    its template: see [`crate::plan`]), so later functions with the
//!    same template reuse it without asking the store again.
//! 5. A batch flush asks the store for the entries of all its functions
//!    that need code many at a time
//!    ([`CodeStore::get_many`]: one round trip to Redis per call, instead
//!    of one or two per function). An entry
//!    found that way is used as one `get` returns it would be, with the
//!    same checks. A function whose entry it did not find is compiled
//!    without asking again, unless the store reserves keys
//!    ([`CodeStore::reserves`]: a [`SharedStore`](crate::store::SharedStore)),
//!    which it then asks with `get_or_reserve`, so that reservations work as
//!    in eager mode. The keys are asked ahead, [`FETCH_AHEAD`] at a time,
//!    on the module's fetcher thread (`store/courier.rs`), so that the
//!    entries are read while the flush records and plans: a function's
//!    key when it is recorded, where it is walked then (batch mode on one
//!    thread; not a definition eager mode left to the flush, whose
//!    template another module is compiling), and the keys of the
//!    functions walked on the flush's threads before planning; each only
//!    where the function's plan, as the module stands, is to load or
//!    compile its code (never a function whose code must come from
//!    compiling it, nor one whose code the module holds). After
//!    planning, a function that needs code takes what was fetched ahead
//!    for its key (the rest is dropped), and the keys not asked ahead (a
//!    function planning rewrote into another template, one walked only
//!    then, one eager mode left to the flush) are asked then, [`GET_MANY_CHUNK`] at a time. An entry
//!    fetched ahead may be older than the flush: in a store that does not
//!    reserve keys, one stored since is missed (a compile more). If a
//!    call fails, ahead or then, each function of its keys asks on its
//!    own (a failed call ahead is counted in `store_errors` only if a
//!    function needs one of its keys), and what the other calls
//!    fetched is used. What was fetched is dropped when the flush ends.
//!    On several [threads](super::DedupOptions::threads), each
//!    entry fetched is checked on the flush's pool (`pool.rs`), for the
//!    first function of the flush it was fetched for, with the checks
//!    that function needs to be defined from it ([`verify::checks_for_entry`]):
//!    [`check`](crate::store::load::check) and those checks are functions
//!    of the entry's bytes, the function, its walk and the module's ISA
//!    and store alone, so the function's turn takes their outcome as its
//!    own when it loads the entry the flush holds for that key. Its
//!    record drops it whenever the function changes (`flush.rs`), and the
//!    turn uses it only for the key, the exact key's hash (template and
//!    names) and the hash of the bytes it was checked for (a store that
//!    reserves keys may hand the flush another value for the key later).
//!    What is counted, logged and kept is as on one thread; a check that
//!    panics on a thread is left to the turn.
//! 6. A module whose first [`REJECTED_ALIKE_TO_WARN`] entries found are
//!    all rejected for one reason (another secret, another build, entries
//!    without unwind information where they are needed), none used, says
//!    so once at `warn` level: a store that serves nothing is not silent.
//! 7. Modules defining one program on a store that reserves keys (a
//!    [`SharedStore`](crate::store::SharedStore)) divide its compiles
//!    instead of queueing: a batch flush claims each template it is about
//!    to compile without waiting, a span of functions at a time in one
//!    call ([`CodeStore::try_get_or_reserve_many`], see `claim_spans`;
//!    where each call is a round trip to a server,
//!    [`CodeStore::round_trips`], the claims of the next span are sent
//!    halfway through a span, to travel on the module's claimer thread,
//!    `store/courier.rs`, while its second half compiles), and defers a
//!    function whose template another module is compiling until
//!    its other functions are defined (in the order they were recorded).
//!    Only then, its claims given up, does it wait for that module's entry
//!    (as a define always did): a module that holds claims never waits for
//!    another, so no two modules wait on each other's claims; a busy
//!    template it must define before (a root of its plan) it compiles
//!    too, a compile more, never other code. On several threads, the
//!    templates it would compile there are claimed in one call first,
//!    those it claims are compiled on them, and those others compile or
//!    the store holds are left to the store. Which function a class's
//!    duplicates run is decided by planning, before any of this, so it
//!    does not depend on timing; what a deferred function reuses or
//!    loads may.
//! 8. In eager mode on such a store, `define_function` does not wait for
//!    another module either: a function whose template another module is
//!    compiling is recorded, as batch mode records every function, and
//!    defined by the next flush (`finalize_definitions`, or
//!    [`DedupModule::flush`]), which waits for that entry only after
//!    defining the rest (7). So do the later functions with a template
//!    deferred so (whatever the store holds by then), so that which
//!    function of a class is canonical does not depend on timing. A
//!    deferred function is kept as it was when deferred (`Role::Kept` in
//!    `flush.rs`): the flush does not rewrite its references to
//!    duplicates found since (its calls of them go through their
//!    trampolines), so that its template stays the one the other module
//!    is compiling, and it loads that module's entry instead of compiling
//!    a template of its own (a thunk of a similar body made for it, which
//!    has no such template, names them as any eager define does, see
//!    `similar.rs`). For the
//!    caller, a deferred definition is a batch definition: it returns `Ok`,
//!    leaves `ctx.compiled_code()` `None`, and a failure of it (which the
//!    first compile would have returned) is the error of the next flush,
//!    listed by [`DedupModule::failed_definitions`]; nothing can call it
//!    before, since nothing is finalized before that flush.
//! 9. Entries are written off the compiling thread, by the module's
//!    [`Writer`] (a thread of its own, a bounded queue): a cold start
//!    compiles on while the store creates files or answers. A batch flush
//!    sends what it compiles [`WRITE_BATCH`] entries (or
//!    [`WRITE_BATCH_BYTES`]) at a time, and what is left before it waits
//!    for another module (7); so does eager mode, but for a store that
//!    reserves keys, to which it sends each entry at once (another module
//!    may be waiting for it); the writer joins what waits into one
//!    [`CodeStore::put_many`] (one round trip to Redis, one write to a
//!    pack, instead of one per entry). Every entry is sent to the writer
//!    by the end of a flush (`finalize_definitions`,
//!    [`DedupModule::flush`]), and written behind it: the flush does not
//!    wait for the store, so that a cold start is not slower for a slow
//!    file system (a store that creates a file per entry) or server; it
//!    counts what was written so far.
//!    [`DedupModule::wait_for_store_writes`] waits until every entry is
//!    written, and so does dropping the module. In a store that reserves
//!    keys, a flush waits for the writer when it ends, where other
//!    modules may be waiting for its entries, and also before it gives
//!    up its claims or a define may wait for another module (others may
//!    be waiting for those entries). An eager define, or one that loads
//!    an entry it holds, waits for no write: it waits for no other
//!    module either. `store_writes` and `store_errors` count the writes
//!    finished by the end of each flush and those the module has waited
//!    for. A process that ends without dropping the module
//!    (`std::process::exit`, a module kept in a `static`) loses the
//!    entries not written by then (the next run compiles those
//!    functions again): such a program calls
//!    [`DedupModule::wait_for_store_writes`] before it ends. A store
//!    that reserves keys in `get_or_reserve` but says otherwise
//!    (`reserves()`) holds its reservations until the writer writes
//!    their entries, behind the flush. The reservations of the entries
//!    end with their write, so a module waiting for one gets it once it
//!    is written, and never waits on a module that waits for it: the
//!    writer depends on no module. A write that fails is counted in
//!    `store_errors` and loses the entries of that write (their keys
//!    are released).

use super::aliases::Named;
use super::flush::{Ahead, Record};
use super::ids::State;
use super::reuse::{self, CodeTemplate};
use super::verify::{Checked, Unverified};
use super::{DedupModule, parallel, pool, verify};
use crate::code::MachineCode;
use crate::fingerprint::Template;
use crate::plan::{ClassFacts, Outcome, Plan, WalkRef};
use crate::store::courier::{Claimer, Fetcher, Ticket};
use crate::store::entry::Digests;
use crate::store::load::{
    Checks, Claimed, Loaded, Miss, Rejection, Reservation, Source, Unwritten, claim, claim_many,
    load,
};
use crate::store::writer::Writer;
use crate::store::{CodeContext, CodeStore, Entry, GET_MANY_CHUNK, Secret, StoreKey};
use cranelift_codegen::Context;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_module::{FuncId, Module, ModuleResult};
use hashbrown::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64;

/// A module's code store, with what its entries are checked against.
/// Dropping it gives up its reservation, if any (see [`Reservation`]).
pub(super) struct Stored {
    store: Arc<dyn CodeStore>,
    context: CodeContext,
    secret: Option<Secret>,
    /// Whether the inner module may write frame descriptions of code
    /// defined from bytes (see 3 above).
    needs_frames: bool,
    /// Whether the warning that entries without unwind information are
    /// not used here was logged.
    warned_frames: bool,
    /// Until an entry is used: the reason the entries found were rejected
    /// for, and how many in a row (0: none yet; see 6 above); `None` once
    /// one is used, or once the warning is logged.
    rejected_alike: Option<(Rejection, u32)>,
    /// The key this module reserved (see [`CodeStore::get_or_reserve`]),
    /// which ends with a `put` or, dropped, a release.
    reserved: Option<Reservation>,
    /// What the current batch flush fetched (see 5 above): for each key
    /// asked, its value if the store had one.
    prefetched: HashMap<StoreKey, Option<Vec<u8>>>,
    /// The keys the current batch flush reserved ahead of their
    /// functions' turns (see 7 above), each ended by its function's
    /// definition or, dropped when the flush ends, released.
    claimed: HashMap<StoreKey, Reservation>,
    /// Eager mode: the templates of the definitions deferred to the next
    /// flush (see 8 above).
    deferred: HashSet<StoreKey>,
    /// Entries compiled and not sent to the writer yet (see 9 above), with
    /// their size in bytes.
    unwritten: Vec<Unwritten>,
    unwritten_bytes: usize,
    /// The keys the current batch flush found another module compiling
    /// when it claimed them ahead (see 7 above).
    busy: HashSet<StoreKey>,
    /// Where every call to the store is a round trip
    /// ([`CodeStore::round_trips`]) and it reserves keys: claims the next
    /// span's templates on a thread of its own (see 7 above).
    claimer: Option<Claimer>,
    /// Where the next span's claims were sent to the claimer and not kept
    /// yet: the ticket of their answer and the keys asked (`None` inside:
    /// that span had nothing to claim).
    claims_ahead: Option<Option<(Ticket, Vec<StoreKey>)>>,
    /// Fetches entries for a batch flush ahead of its prefetch (see 5
    /// above): started when the first keys are sent.
    fetcher: Option<Fetcher>,
    /// What the next flush asked the fetcher for and has not received:
    /// each request's ticket and keys, ...
    fetching: Vec<(Ticket, Vec<StoreKey>)>,
    /// ... the keys not sent yet, ...
    fetch_next: Vec<StoreKey>,
    /// ... and every key asked, sent or not.
    fetch_asked: HashSet<StoreKey>,
    /// Writes entries on a thread of its own (see 9 above). Last, so that
    /// it is dropped (which waits for what it has to write) once the
    /// reservations held above, claims ahead among them, are given up.
    writer: Writer,
}

impl Drop for Stored {
    /// Sends what is not sent yet (eager mode, since the last flush), so
    /// that the writer, dropped next, writes it (see 9 above).
    fn drop(&mut self) {
        if !self.unwritten.is_empty() {
            self.writer.send(std::mem::take(&mut self.unwritten));
        }
    }
}

/// The fewest functions ahead of its turn a flush claims templates for,
/// in one round trip (see 7 above)...
const CLAIM_AHEAD_MIN: usize = 16;

/// ... the most...
const CLAIM_AHEAD_MAX: usize = 256;

/// ... and, between the two, this share of the functions left (see
/// [`claim_span`]).
const CLAIM_SHARE: usize = 32;

/// How many functions, from its turn on, a flush with `left` functions
/// still to go through claims templates for in one round trip (see 7
/// above): a share of what is left, within bounds. Large spans early cost
/// few round trips (a Redis server's are the price of dividing the
/// compiles); spans shrink toward the end of the flush, so that modules
/// dividing one program finish their shares at about the same time, as in
/// guided self-scheduling.
fn claim_span(left: usize) -> usize {
    (left / CLAIM_SHARE).clamp(CLAIM_AHEAD_MIN, CLAIM_AHEAD_MAX)
}

/// The spans, in order, in which a flush of `len` functions claims
/// templates (see [`claim_span`]): they cover `0..len`, each ending where
/// the next begins.
pub(super) fn claim_spans(len: usize) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut start = 0;
    while start < len {
        let end = len.min(start + claim_span(len - start));
        spans.push(start..end);
        start = end;
    }
    spans
}

/// A flush sends the keys of the functions it walks to its fetcher this
/// many at a time (see 5 above): a request is a few hundred microseconds
/// of file reads or one round trip, so that what is fetched keeps pace
/// with what is recorded.
const FETCH_AHEAD: usize = 64;

/// A module sends its entries to the writer once this many are waiting
/// (see 9 above)...
const WRITE_BATCH: usize = 32;

/// ... or once they hold this many bytes.
const WRITE_BATCH_BYTES: usize = 1 << 20;

impl<M: Module> DedupModule<M> {
    /// Looks every function to be compiled up in `store` first, and stores
    /// what is compiled (see the [module docs](super)); with `secret`,
    /// entries are signed, and only signed entries are used (see
    /// [`crate::store`] for the trust model).
    ///
    /// Entries made without unwind information (the `store-unwind` feature
    /// off) are used only in modules that write no frame descriptions for
    /// code defined from bytes: a wrapped `JITModule`, however it was
    /// made. An `ObjectModule` writes them, and a module jitfold does not
    /// know is assumed to (see [`DedupModule::wrap`]).
    ///
    /// Entries are written on a thread this call starts (see 9 in the
    /// module docs), behind the flushes: a flush ends once its functions
    /// are defined, not once their entries are written, but for a store
    /// that reserves keys, where other modules may be waiting for them.
    /// [`DedupModule::wait_for_store_writes`] waits until every entry is
    /// written, and so does dropping the module; a program that ends
    /// without dropping it (`std::process::exit`, a module in a `static`)
    /// calls it first, or loses the entries not written by then.
    ///
    /// On a store that reserves keys and whose calls are round trips
    /// ([`CodeStore::round_trips`]: a `RedisStore` with leases), a second
    /// thread claims templates for a flush ahead of its compiles (see 7 in
    /// the module docs). Where a batch flush asks for entries ahead, they
    /// are fetched on a thread started at its first request, whatever the
    /// store (see 5 there). Dropping the module ends them.
    pub fn with_store(mut self, store: Arc<dyn CodeStore>, secret: Option<Secret>) -> Self {
        self.stored = Some(Stored {
            writer: Writer::new(store.clone()),
            claimer: (store.reserves() && store.round_trips())
                .then(|| Claimer::claimer(store.clone())),
            claims_ahead: None,
            fetcher: None,
            fetching: Vec::new(),
            fetch_next: Vec::new(),
            fetch_asked: HashSet::new(),
            store,
            context: CodeContext::of(self.inner.isa()),
            secret,
            needs_frames: self.writes_frames,
            warned_frames: false,
            rejected_alike: Some((Rejection::Names, 0)),
            reserved: None,
            prefetched: HashMap::new(),
            claimed: HashMap::new(),
            deferred: HashSet::new(),
            unwritten: Vec::new(),
            unwritten_bytes: 0,
            busy: HashSet::new(),
        });
        self
    }

    /// Waits until every entry this module has made is written to its
    /// store, and counts the writes in [`Stats`](crate::Stats)
    /// (`store_writes`, and `store_errors` for writes that failed).
    /// Entries are written on a thread of the module's own, behind its
    /// flushes (see [`DedupModule::with_store`]); dropping the module
    /// waits for them too. A module without a store has nothing to wait
    /// for.
    pub fn wait_for_store_writes(&mut self) {
        self.wait_for_writes();
    }

    /// Holds the store's entries for every function of `flush` that
    /// needs code: what was fetched ahead for its key, else fetched now,
    /// with one [`CodeStore::get_many`] per [`GET_MANY_CHUNK`] keys (see 5
    /// above). A function not walked yet (planning walks none
    /// on an ISA without trampolines) is walked here, and the define uses
    /// that walk.
    pub(super) fn prefetch_stored(&mut self, flush: &mut [Record]) {
        let Some(mut ahead) = self.stored.as_mut().map(Stored::receive_fetches) else {
            return;
        };
        self.end_prefetch();
        for record in flush.iter_mut() {
            // A function that cannot be walked fails in its define.
            if self.ids.state(record.id) == State::Pending {
                let _ = self.walk_pending(record);
            }
        }
        let foreseen = self.forecast(flush);
        let stored = self.stored.as_ref().expect("checked above");
        let mut asked = HashSet::new();
        // The first function each key is asked for.
        let mut firsts = Vec::new();
        for (index, (record, foreseen)) in flush.iter_mut().zip(foreseen).enumerate() {
            if !foreseen.is_some_and(|f| f.load && f.needs_code) {
                continue;
            }
            let walk = record.walk.as_ref().expect("planned").as_ref();
            // Kept for the function's define, which would compute it again.
            let known = known_key(&stored.context, &walk, record.key.take());
            record.key = Some(known);
            if asked.insert(known.key) {
                firsts.push((index, known.key));
            }
        }
        // What was fetched ahead for a key asked now is used, and a key
        // whose request failed asks on its own, as after a failed chunk
        // below; the rest is fetched now.
        let stored = self.stored.as_mut().expect("checked above");
        let mut missing = Vec::new();
        let mut failed = HashMap::new();
        for &(_, key) in &firsts {
            match ahead.remove(&key) {
                Some(Fetched::Value(value)) => {
                    stored.prefetched.insert(key, value);
                }
                Some(Fetched::Failed(request)) => *failed.entry(request).or_insert(0) += 1,
                None => missing.push(key),
            }
        }
        drop(ahead);
        // A failed request counts once, if it asked for a key needed now.
        for asked in failed.values() {
            log::warn!(
                "code store: a fetch failed; asking for each of {asked} functions on its own"
            );
        }
        self.stats.store_errors += failed.len() as u64;
        self.fetch(missing);
        self.check_fetched(flush, &firsts);
    }

    /// Asks the store for the entry of `record`'s template, if it is
    /// walked, on the fetcher's thread, for the next flush's prefetch (see
    /// 5 above): a flush reads its entries while it records and plans. The
    /// store key is kept in the record, for the prefetch and the define.
    pub(super) fn fetch_ahead(&mut self, record: &mut Record) {
        let (Some(stored), Some(walk)) = (&self.stored, &record.walk) else {
            return;
        };
        // Only what its define would ask for, as the module stands: a
        // function whose code must come from compiling it is never asked
        // for, nor one whose code the module holds (see 1 and 4 above).
        let plan = self
            .compiled
            .plan(&walk.planned(&record.func), self.policy());
        if !(plan.load && plan.needs_code()) {
            return;
        }
        let known = known_key(&stored.context, &walk.as_ref(), record.key.take());
        let stored = self.stored.as_mut().expect("checked above");
        record.key = Some(known);
        stored.fetch_ahead(known.key);
    }

    /// Asks ahead (see [`Self::fetch_ahead`]), on several threads, for the
    /// entries of every pending function of `flush` walked there and not
    /// asked for yet (on one thread, each was considered when it was
    /// recorded), and sends what is asked: they travel while the flush
    /// plans.
    pub(super) fn fetch_flush_ahead(&mut self, flush: &mut [Record]) {
        if self.stored.is_none() {
            return;
        }
        if self.options.threads > 1 {
            for record in flush.iter_mut() {
                if self.ids.state(record.id) == State::Pending && record.key.is_none() {
                    self.fetch_ahead(record);
                }
            }
        }
        self.stored.as_mut().expect("checked above").send_fetches();
    }

    /// On several threads, checks on the flush's pool the entry fetched
    /// for each of `firsts` (a record's index, and its template's key) and
    /// the function's checks for it (see 5 above), each outcome kept in
    /// its record; nothing on one thread.
    fn check_fetched(&mut self, flush: &mut [Record], firsts: &[(usize, StoreKey)]) {
        let threads = self.options.threads.max(1);
        let Some(stored) = self.stored.as_ref().filter(|_| threads > 1) else {
            return;
        };
        let jobs: Vec<EntryJob<'_>> = firsts
            .iter()
            .filter_map(|&(index, key)| {
                let Some(Some(bytes)) = stored.prefetched.get(&key) else {
                    return None;
                };
                let record = &flush[index];
                Some(EntryJob {
                    index,
                    key,
                    bytes,
                    func: &record.func,
                    walk: record.walk.as_ref()?.as_ref(),
                })
            })
            .collect();
        if jobs.is_empty() {
            return;
        }
        let checks = Checks {
            context: &stored.context,
            secret: stored.secret.as_ref(),
            isa: self.inner.isa(),
            needs_unwind: stored.needs_frames,
        };
        let done = pool::run(threads, &jobs, || (), |(), job| job.check(&checks));
        let indices: Vec<usize> = jobs.iter().map(|job| job.index).collect();
        drop(jobs);
        for (job, entry) in done.results {
            flush[indices[job]].entry = entry;
        }
    }

    /// Fetches the entries of `keys` (see 5 above) into what the flush
    /// fetched, with one [`CodeStore::get_many`] per [`GET_MANY_CHUNK`]
    /// keys.
    fn fetch(&mut self, keys: Vec<StoreKey>) {
        let Some(stored) = &mut self.stored else {
            return;
        };
        // In chunks, so that a chunk that fails loses only its own keys.
        let mut errors = 0;
        for chunk in keys.chunks(GET_MANY_CHUNK) {
            match stored.store.get_many(chunk) {
                Ok(values) => stored.prefetched.extend(chunk.iter().copied().zip(values)),
                Err(e) => {
                    log::warn!(
                        "code store: {e}; asking for each of {} functions on its own",
                        chunk.len()
                    );
                    errors += 1;
                }
            }
        }
        self.stats.store_errors += errors;
    }

    /// Fetches again, at once, the entries of the records of `flush` at
    /// `deferred`, whose templates other modules were compiling (see 7
    /// above): those stored since are then loaded without waiting, and a
    /// function waits for its entry only if it is still missing.
    pub(super) fn refetch_deferred(&mut self, flush: &[Record], deferred: &[usize]) {
        let Some(stored) = &mut self.stored else {
            return;
        };
        let keys: Vec<StoreKey> = deferred
            .iter()
            .filter_map(|&i| flush[i].walk.as_ref())
            .map(|walk| store_key(&stored.context, &walk.as_ref()))
            .filter(|key| stored.prefetched.get(key).is_none_or(Option::is_none))
            .collect();
        self.fetch(keys);
    }

    /// Forgets what a flush asked ahead and did not receive (see 5 above).
    pub(super) fn forget_fetches(&mut self) {
        if let Some(stored) = &mut self.stored {
            stored.forget_fetches();
        }
    }

    /// Whether this module holds a store reservation, prefetched entries,
    /// claims, entries not sent to the writer or keys asked ahead (none
    /// outlives a flush, nor, but for keys asked ahead of a batch flush,
    /// a definition).
    pub(super) fn holds_store_state(&self) -> bool {
        self.stored.as_ref().is_some_and(|s| {
            s.reserved.is_some()
                || !s.prefetched.is_empty()
                || !s.claimed.is_empty()
                || s.claims_ahead.is_some()
                || !s.unwritten.is_empty()
                || !s.fetch_asked.is_empty()
                || !s.fetching.is_empty()
        })
    }

    /// Whether this module has a store, and one that reserves keys
    /// ([`CodeStore::reserves`]): where modules wait for each other.
    fn store_reserves(&self) -> bool {
        self.stored.as_ref().is_some_and(|s| s.store.reserves())
    }

    /// Sends what the flush (or an eager define) compiled and has not sent
    /// to the writer, in a store that reserves keys (see 9 above), gives
    /// up the keys it claimed and did not compile (see 7 above), and drops
    /// what it fetched (see 5 above). Waits for nothing: what follows is
    /// the end of the flush, which waits for the writer in such a store,
    /// or the return of an eager define, which waits for nobody.
    pub(super) fn end_prefetch(&mut self) {
        if self.store_reserves() {
            self.write_stored();
        }
        if let Some(stored) = &mut self.stored {
            // Claims sent ahead and not kept (a flush cut short) are
            // waited for and given up with the rest.
            stored.keep_claims_ahead();
            stored.claimed = HashMap::new();
            stored.prefetched = HashMap::new();
            stored.busy = HashSet::new();
        }
    }

    /// Claims, in one round trip, the templates of the functions of
    /// `flush` in `span` that this flush would load or compile and has not
    /// claimed or found yet (see 7 above): a reservation is kept as
    /// claimed, an entry as fetched, a template another module is
    /// compiling as busy. Where [`Self::send_claims_ahead`] sent them
    /// already, they are kept now, waiting for their answer if need be.
    /// Only in a store that reserves keys.
    pub(super) fn claim_ahead(&mut self, flush: &mut [Record], span: std::ops::Range<usize>) {
        if !self.store_reserves() {
            return;
        }
        let stored = self.stored.as_mut().expect("checked above");
        if !stored.keep_claims_ahead() {
            let keys = self.keys_to_claim(&mut flush[span]);
            self.stored
                .as_mut()
                .expect("checked above")
                .claim_keys(keys);
        }
    }

    /// Where the store's calls are round trips (a module with a claimer),
    /// sends the claims of the functions of `flush` in `span` to the
    /// claimer thread, to travel while this flush defines what comes
    /// before `span`; [`Self::claim_ahead`] keeps them when `span` begins.
    /// A flush sends a span's claims halfway through the span before it:
    /// sent earlier, they would hide more of a round trip, but hold
    /// templates longer, and near the end of a flush, another module
    /// without work left waits for what this one holds.
    pub(super) fn send_claims_ahead(&mut self, flush: &mut [Record], span: std::ops::Range<usize>) {
        if self.stored.as_ref().is_none_or(|s| s.claimer.is_none()) {
            return;
        }
        let keys = self.keys_to_claim(&mut flush[span]);
        self.stored
            .as_mut()
            .expect("checked above")
            .send_claims(keys);
    }

    /// The store keys of the templates of `records` that this flush would
    /// load or compile (see [`Self::claim_ahead`]).
    fn keys_to_claim(&mut self, records: &mut [Record]) -> Vec<StoreKey> {
        let mut keys = Vec::new();
        for record in records {
            if self.ids.state(record.id) != State::Pending || record.code.is_some() {
                continue;
            }
            keys.extend(self.needed_key(&record.func, &mut record.walk));
        }
        keys
    }

    /// Claims, in one call, the templates of the functions walked as
    /// `walks`, whose plans load their code (see 7 above), for the
    /// selection of what a flush compiles on its threads, which
    /// [`DedupModule::store_serves`] then answers without asking again.
    /// Only in a store that reserves keys.
    pub(super) fn claim_all<'w>(
        stored: &mut Option<Stored>,
        walks: impl Iterator<Item = WalkRef<'w>>,
    ) {
        let Some(stored) = stored.as_mut().filter(|s| s.store.reserves()) else {
            return;
        };
        let keys: Vec<StoreKey> = walks
            .map(|walk| store_key(&stored.context, &walk))
            .collect();
        stored.claim_keys(keys);
    }

    /// Forgets which templates were busy when [`Self::claim_all`] claimed
    /// them, once the selection is made: by the time their functions'
    /// turns come, their holders may be done, and the claims ahead ask
    /// again (see 7 above).
    pub(super) fn forget_busy(stored: &mut Option<Stored>) {
        if let Some(stored) = stored {
            stored.busy.clear();
        }
    }

    /// Gives up the keys this flush claimed and has not compiled yet: the
    /// functions they were claimed for are defined (or were planned
    /// otherwise since), so nobody is to wait for them (see 7 above).
    pub(super) fn release_claims(&mut self) {
        // What others may wait for is written first: in a store that
        // reserves keys, before the claims are given up (elsewhere nobody
        // waits: what is not sent goes with the next few dozen entries or
        // at the end of the flush, see 9 above).
        if self.store_reserves() {
            self.wait_for_writes();
        }
        if let Some(stored) = &mut self.stored {
            stored.claimed = HashMap::new();
        }
    }

    /// Whether another module is compiling the template of pending `func`
    /// (walked as `known`, if it was), whose code this flush would load or
    /// compile now (see 7 above): then its definition waits until the
    /// flush's other functions are defined. Claims the template otherwise,
    /// so that others defer it in turn.
    pub(super) fn compiled_elsewhere(
        &mut self,
        func: &Function,
        known: &mut Option<crate::plan::Walk>,
    ) -> bool {
        self.claim_template(func, known, false)
    }

    /// Eager mode: whether the definition of `func` (walked as `known`,
    /// if it was; walked here otherwise) waits for the next flush, since
    /// another module is compiling its template, or an earlier definition
    /// of this module with its template waits already (see 8 above).
    /// Claims the template otherwise, for the define that follows (which
    /// [`DedupModule::end_prefetch`] ends).
    pub(super) fn defers_to_flush(
        &mut self,
        func: &Function,
        known: &mut Option<crate::plan::Walk>,
    ) -> bool {
        self.claim_template(func, known, true)
    }

    /// [`DedupModule::compiled_elsewhere`], and, if `eager`,
    /// [`DedupModule::defers_to_flush`].
    fn claim_template(
        &mut self,
        func: &Function,
        known: &mut Option<crate::plan::Walk>,
        eager: bool,
    ) -> bool {
        if !self.store_reserves() {
            return false;
        }
        // Walked as it is (its definition rewrites references to
        // duplicates first; should that change it, what is claimed here is
        // released when the flush ends).
        let Some(key) = self.needed_key(func, known) else {
            return false;
        };
        let stored = self.stored.as_mut().expect("checked above");
        if eager && stored.deferred.contains(&key) {
            return true;
        }
        let busy = stored.claim(key) == Served::Busy;
        if eager && busy {
            stored.deferred.insert(key);
        }
        busy
    }

    /// The store key of the template of `func` (walked as `known`; walked
    /// here, as it is, if it was not), if there is a store and its plan is
    /// to load or compile its code; `None` otherwise, and for a function
    /// that cannot be walked (which fails in its define).
    fn needed_key(
        &mut self,
        func: &Function,
        known: &mut Option<crate::plan::Walk>,
    ) -> Option<StoreKey> {
        self.stored.as_ref()?;
        if known.is_none() {
            let walk =
                verify::walk_checked(&mut self.fingerprinter, func, self.inner.isa()).ok()?;
            *known = Some(walk.to_owned());
        }
        let walk = known.as_ref().expect("walked").as_ref();
        let plan = self.compiled.plan(&walk.planned(func), self.policy());
        let stored = self.stored.as_ref().expect("checked above");
        (plan.load && plan.needs_code()).then(|| store_key(&stored.context, &walk))
    }

    /// Forgets which templates eager definitions waited for: the flush
    /// that defines them has begun (see 8 above).
    pub(super) fn forget_deferred(&mut self) {
        if let Some(stored) = &mut self.stored {
            stored.deferred.clear();
        }
    }

    /// Defines `id` (walked as `walk`, planned as `plan`) from the store's
    /// entry for its template, if there is one that passes every check (see
    /// 1 to 3 above); `None` (defining nothing) otherwise. What it keeps
    /// for later functions is what compiling it would keep. The entry a
    /// flush's thread checked for it and its template's store key as the
    /// flush computed it, if any, are taken from `ahead`.
    pub(super) fn define_stored(
        &mut self,
        id: FuncId,
        walk: &WalkRef<'_>,
        func: &Function,
        plan: &Plan,
        ahead: &mut Ahead,
        verified: &mut Unverified,
    ) -> ModuleResult<Option<Outcome>> {
        let (entry, known) = (ahead.entry.take(), ahead.key.take());
        // A reservation left by a definition that unwound is given up.
        self.end_reservation();
        let Some(stored) = &mut self.stored else {
            return Ok(None);
        };
        let KnownKey { key, exact } = known_key(&stored.context, walk, known);
        debug_assert_eq!(key, store_key(&stored.context, walk));
        stored.settle_claims_ahead(&key);
        // Claimed by this flush ahead of its turn: this module compiles it.
        if let Some(reservation) = stored.claimed.remove(&key) {
            stored.reserved = Some(reservation);
            self.stats.store_misses += 1;
            return Ok(None);
        }
        let source = match stored.prefetched.remove(&key) {
            Some(fetched) => Source::Fetched(fetched),
            None => Source::Ask,
        };
        let asks = matches!(source, Source::Ask | Source::Fetched(None));
        // A module holding no claims that asks the store may wait for
        // another below (in a store that reserves keys): what it compiled
        // and has not written, which the other may be waiting for, is
        // written first (see 7 and 9 above; at once where nothing is
        // being written). One that holds the entry asks nothing, and so
        // waits for nobody: its writes go on behind it.
        if asks && !stored.holds_claims() && stored.store.reserves() {
            self.wait_for_writes();
        }
        let stored = self.stored.as_mut().expect("checked above");
        let checks = Checks {
            context: &stored.context,
            secret: stored.secret.as_ref(),
            isa: self.inner.isa(),
            needs_unwind: stored.needs_frames,
        };
        // Checked on a flush's thread, from the bytes the flush holds for
        // this key, for this function (see 5 above).
        let entry = entry.filter(|entry| {
            let Source::Fetched(Some(bytes)) = &source else {
                return false;
            };
            entry.key == key && entry.exact == exact && entry.bytes == xxh3_64(bytes)
        });
        let mut function_checks = None;
        let loaded = if let Some(entry) = entry {
            function_checks = entry.checks;
            entry.loaded.map_err(Miss::Rejected)
        } else if asks && stored.holds_claims() && stored.store.reserves() {
            // A module that holds claims never waits for another (which
            // may be waiting for one of them): a template another module
            // is compiling is compiled here too, a compile more, never
            // other code (see 7 above).
            match claim(&stored.store, key) {
                Ok(Claimed::Found(value)) => load(
                    &stored.store,
                    key,
                    Source::Fetched(Some(value)),
                    &checks,
                    walk.template_key(),
                    walk.names,
                ),
                Ok(Claimed::Reserved(reservation)) => Err(Miss::Reserved(reservation)),
                Ok(Claimed::Busy) => Err(Miss::Absent),
                Err(e) => Err(Miss::Store(e)),
            }
        } else {
            load(
                &stored.store,
                key,
                source,
                &checks,
                walk.template_key(),
                walk.names,
            )
        };
        let Loaded {
            code,
            unwind,
            compile_time: saved,
            verified: read_digest,
        } = match loaded {
            Ok(loaded) => loaded,
            Err(Miss::Absent) => {
                self.stats.store_misses += 1;
                return Ok(None);
            }
            Err(Miss::Reserved(reservation)) => {
                // This module compiles it.
                stored.reserved = Some(reservation);
                self.stats.store_misses += 1;
                return Ok(None);
            }
            Err(Miss::Store(e)) => {
                log::warn!("code store: {e}; compiling without it");
                self.stats.store_errors += 1;
                return Ok(None);
            }
            Err(Miss::Rejected(rejection)) => {
                if rejection == Rejection::UnwindOmitted && !stored.warned_frames {
                    stored.warned_frames = true;
                    log::warn!(
                        "code store: entries without unwind information (built without \
                         the `store-unwind` feature) are not used by a module that may \
                         write frame descriptions (made with `DedupModule::wrap`); a JIT \
                         module made with `DedupModule::<JITModule>::with_options` uses them"
                    );
                }
                stored.note_rejected(rejection.clone());
                log::debug!(
                    "{} ({id}): the store's entry {key} cannot be used ({rejection}); compiling",
                    self.function_name(id)
                );
                self.stats.store_rejected += 1;
                return Ok(None);
            }
        };
        // An entry is used: rejections are no longer all alike.
        stored.rejected_alike = None;
        let Some(relocs) = reuse::module_relocs(&code, id) else {
            self.stats.store_rejected += 1;
            return Ok(None);
        };
        // A function read alike to the one the entry was compiled from
        // passed the checks in that compile (see 6 in `verify.rs`).
        self.verify_for_entry(func, read_digest.as_ref(), function_checks, verified)?;
        let own = if self.options.check {
            let own = self.compile_for_check(id, func)?;
            if own != code {
                log::debug!(
                    "{} ({id}): the store's entry {key} is not its own code; compiling",
                    self.function_name(id)
                );
                self.stats.store_rejected += 1;
                return Ok(None);
            }
            Some(own)
        } else {
            None
        };
        // Should the inner module still panic on the entry's relocations
        // (cranelift-object does on a kind its file format cannot express,
        // before it records anything), the entry is not used.
        let inner = &mut self.inner;
        let defined = catch_unwind(AssertUnwindSafe(|| {
            inner.define_function_bytes(id, u64::from(code.alignment), &code.bytes, &relocs)
        }));
        match defined {
            Ok(result) => result?,
            Err(panic) => {
                log::warn!(
                    "code store: the inner module panicked on the entry {key} of {} ({id}): {}; \
                     compiling",
                    self.function_name(id),
                    crate::compile::panic_message(&panic)
                );
                self.stats.store_rejected += 1;
                return Ok(None);
            }
        }
        for reloc in &relocs {
            self.ids.note_reference(&reloc.name);
        }
        let code_bytes = code.bytes.len() as u64;
        log::debug!(
            "{} ({id}): loaded from the code store, {code_bytes} bytes",
            self.function_name(id)
        );
        // Its frame, for object files (see `unwind.rs`): its own, since
        // the template may be kept already (without reuse, say).
        if let Some(unwind) = &unwind {
            self.frames.push_own(id, unwind.clone());
        }
        // Kept for reuse where compiling it would keep it: where the plan
        // (of this walk) keeps its template, a copy of the walk's words
        // the class's key shares.
        if let Some(template) = plan.keep_template.clone()
            && let Some(code) = CodeTemplate::from_parts(id, code, walk.names, saved, unwind)
        {
            debug_assert_eq!(template.key(), walk.template_key());
            self.compiled.keep_template(template, code);
        }
        let facts = ClassFacts {
            code_bytes,
            compile_time: saved,
        };
        let class = self.start_class(id, walk, facts, plan.fingerprint.clone());
        debug_assert!(matches!(self.ids.state(id), State::Compiled(_)));
        // Found by adapters, as compiled code is.
        if let Some(body) = &plan.keep_body {
            let call_conv = self.call_conv(id);
            self.compiled.keep_body(body.clone(), class, call_conv);
        }
        self.keep_reference_code(id, func, own);
        Ok(Some(Outcome::Loaded { code_bytes, saved }))
    }

    /// Stores the code just compiled for a function walked as `walk` (with
    /// template `template`, compiled in `time`): in `ctx`, or on another
    /// thread (`precompiled`), if there is a store and the code can be
    /// retargeted. `read_digest` is the function's read digests before the
    /// compile, where the compile checked it (see 6 in `verify.rs`).
    pub(super) fn store_compiled(
        &mut self,
        ctx: &Context,
        precompiled: Option<&parallel::Compiled>,
        walk: &WalkRef<'_>,
        template: Option<Template>,
        time: Duration,
        read_digest: Option<Digests>,
    ) {
        let Some(stored) = &self.stored else {
            return;
        };
        // A reservation not ended by the `put` below is released by
        // `end_reservation`.
        let (code, unwind) = match precompiled {
            Some(compiled) => (compiled.code.clone(), compiled.unwind.clone()),
            None => {
                let Some(code) = MachineCode::of(ctx) else {
                    return;
                };
                let unwind: Option<UnwindInfo> = ctx.compiled_code().and_then(|compiled| {
                    compiled.create_unwind_info(self.inner.isa()).ok().flatten()
                });
                (code, unwind)
            }
        };
        let template = template.unwrap_or_else(|| walk.fingerprint.to_template());
        let Some(mut entry) = Entry::new(&template, walk.names, &code, time, unwind.as_ref())
        else {
            return;
        };
        if let Some(digest) = read_digest {
            entry = entry.with_verified(digest);
        }
        let key = StoreKey::of(&stored.context, &template);
        let value = entry.encode(&stored.context, stored.secret.as_ref());
        let stored = self.stored.as_mut().expect("checked above");
        let reservation = match stored.reserved.take() {
            Some(reservation) if reservation.key() == key => Some(reservation),
            other => {
                stored.reserved = other;
                None
            }
        };
        stored.unwritten_bytes += value.len();
        stored.unwritten.push(Unwritten {
            key,
            value,
            reservation,
        });
        // A few dozen entries at a time, but eager mode on a store that
        // reserves keys writes at once (see 9 above).
        let batched = self.options.mode == super::Mode::Batch || !stored.store.reserves();
        if !batched
            || stored.unwritten.len() >= WRITE_BATCH
            || stored.unwritten_bytes >= WRITE_BATCH_BYTES
        {
            self.write_stored();
        }
    }

    /// Sends the entries waiting to be written to the writer thread (see
    /// 9 above).
    pub(super) fn write_stored(&mut self) {
        let Some(stored) = &mut self.stored else {
            return;
        };
        if stored.unwritten.is_empty() {
            return;
        }
        stored.unwritten_bytes = 0;
        stored.writer.send(std::mem::take(&mut stored.unwritten));
    }

    /// At the end of a flush (see 9 above): sends what waits to be
    /// written to the writer, and, in a store that reserves keys, waits
    /// until it is written; elsewhere counts what is written so far.
    pub(super) fn end_writes(&mut self) {
        self.count_writes(self.store_reserves());
    }

    /// Waits until every entry sent to the writer is written, and counts
    /// the writes (see 9 above).
    pub(super) fn wait_for_writes(&mut self) {
        self.count_writes(true);
    }

    /// Sends what waits to be written to the writer, and counts the writes
    /// finished: every one, once written, if `wait`; else those finished
    /// so far.
    fn count_writes(&mut self, wait: bool) {
        self.write_stored();
        if let Some(stored) = &mut self.stored {
            let written = if wait {
                stored.writer.wait()
            } else {
                stored.writer.written_so_far()
            };
            self.stats.store_writes += written.entries;
            self.stats.store_errors += written.errors;
        }
    }

    /// Whether a function walked as `walk`, whose plan loads its code from
    /// the store if `loads` ([`Plan::load`]), is the store's to serve: it
    /// holds an entry for its template (not checked), or, in a store that
    /// reserves keys, another module is compiling it (see 7 above). Such a
    /// function is not compiled on a flush's threads. A template the
    /// store reserves for this module here is claimed until its
    /// function's turn.
    pub(super) fn store_serves(
        stored: &mut Option<Stored>,
        walk: &WalkRef<'_>,
        loads: bool,
    ) -> bool {
        stored.as_mut().is_some_and(|stored| {
            loads && stored.claim(store_key(&stored.context, walk)) != Served::No
        })
    }

    /// Whether a function walked as `walk`, whose plan loads its code from
    /// the store if `loads` ([`Plan::load`]), finds an entry for its
    /// template there (not checked, nor claimed: similar merging leaves
    /// such functions to the store).
    pub(super) fn store_holds(&self, walk: &WalkRef<'_>, loads: bool) -> bool {
        let Some(stored) = self.stored.as_ref().filter(|_| loads) else {
            return false;
        };
        let key = store_key(&stored.context, walk);
        match stored.prefetched.get(&key) {
            Some(value) => value.is_some(),
            None => matches!(stored.store.get(&key), Ok(Some(_))),
        }
    }

    /// Takes the reservation this module holds (if any) out of its care,
    /// for a define nested in another (a merged body, defined while one of
    /// its members is), which begins and ends reservations of its own; the
    /// outer define gets it back with [`Self::restore_reservation`].
    pub(super) fn take_reservation(&mut self) -> Option<Reservation> {
        self.stored
            .as_mut()
            .and_then(|stored| stored.reserved.take())
    }

    /// Gives back a reservation [`Self::take_reservation`] took, once the
    /// nested define is done (a reservation of its own still held, which
    /// every path of a define ends, would be released first).
    pub(super) fn restore_reservation(&mut self, reservation: Option<Reservation>) {
        self.end_reservation();
        if let Some(stored) = &mut self.stored {
            stored.reserved = reservation;
        }
    }

    /// Releases the key this module reserved, if the definition that
    /// reserved it did not `put` it (its compile failed, panicked, or made
    /// no entry): waiting modules may then compile it (see 3 in
    /// [`crate::store::shared`]).
    pub(super) fn end_reservation(&mut self) {
        if let Some(stored) = &mut self.stored {
            // Dropped: released (see `Reservation`).
            stored.reserved = None;
        }
    }
}

/// What [`Stored::claim`] found of a template.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Served {
    /// Nothing: this module compiles it (claimed, where the store
    /// reserves keys).
    No,
    /// The store holds an entry.
    Found,
    /// Another module is compiling it.
    Busy,
}

/// How many entries found in a row, none used, all rejected for one
/// reason, make a module say so (see 6 above).
const REJECTED_ALIKE_TO_WARN: u32 = 3;

impl Stored {
    /// Claims, in one call ([`claim_many`]), the templates of `keys`
    /// that this flush has not claimed or found yet (see 7 above): a
    /// reservation is kept as claimed, an entry as fetched, a template
    /// another module is compiling as busy. Should the call fail, nothing
    /// is kept: each function claims on its own in its turn.
    fn claim_keys(&mut self, keys: Vec<StoreKey>) {
        let keys = self.unknown_keys(keys);
        if keys.is_empty() {
            return;
        }
        if let Ok(claims) = claim_many(&self.store, &keys) {
            self.keep_claims(keys, claims);
        }
    }

    /// Sends the templates of `keys` that this flush has not claimed or
    /// found yet to the claimer, as the claims of the next span, whose
    /// answer [`Stored::keep_claims_ahead`] keeps as [`Stored::claim_keys`]
    /// would. Only with a claimer.
    fn send_claims(&mut self, keys: Vec<StoreKey>) {
        let keys = self.unknown_keys(keys);
        let Some(claimer) = self.claimer.as_mut() else {
            return;
        };
        debug_assert!(self.claims_ahead.is_none(), "one span's claims ahead");
        let sent = (!keys.is_empty()).then(|| (claimer.send(keys.clone()), keys));
        self.claims_ahead = Some(sent);
    }

    /// Keeps the claims sent ahead for the next span, waiting for their
    /// answer, as [`Stored::claim_keys`] keeps its own; a failed answer
    /// keeps nothing. Returns whether that span's claims were sent.
    fn keep_claims_ahead(&mut self) -> bool {
        let Some(sent) = self.claims_ahead.take() else {
            return false;
        };
        if let Some((ticket, keys)) = sent {
            let claims = self.claimer.as_mut().and_then(|c| c.receive(ticket));
            if let Some(claims) = claims {
                self.keep_claims(keys, claims);
            }
        }
        true
    }

    /// Keeps the claims sent ahead first where `key` is among them, so
    /// that a key is never claimed again while its claim travels (Redis
    /// answers its holder's own lease as reserved: two reservations of
    /// one lease, the first to end ending both).
    fn settle_claims_ahead(&mut self, key: &StoreKey) {
        if let Some(Some((_, keys))) = &self.claims_ahead
            && keys.contains(key)
        {
            self.keep_claims_ahead();
        }
    }

    /// Asks the fetcher for `key`'s entry for the next flush's prefetch,
    /// unless it was asked already (see 5 above): sent with the keys
    /// asked before it once [`FETCH_AHEAD`] are waiting, or by
    /// [`Self::send_fetches`].
    fn fetch_ahead(&mut self, key: StoreKey) {
        if self.fetch_asked.insert(key) {
            self.fetch_next.push(key);
            if self.fetch_next.len() >= FETCH_AHEAD {
                self.send_fetches();
            }
        }
    }

    /// Sends the fetcher the keys asked and not sent, if any.
    fn send_fetches(&mut self) {
        if self.fetch_next.is_empty() {
            return;
        }
        let keys = std::mem::take(&mut self.fetch_next);
        let store = &self.store;
        let fetcher = self
            .fetcher
            .get_or_insert_with(|| Fetcher::fetcher(store.clone()));
        self.fetching.push((fetcher.send(keys.clone()), keys));
    }

    /// What the fetcher fetched for the next flush, received (waiting
    /// for it where need be): every key asked ahead, with its value
    /// (`None` where the store does not hold it), or, where its request
    /// failed, [`Fetched::Failed`]. Nothing is asked ahead any more.
    fn receive_fetches(&mut self) -> HashMap<StoreKey, Fetched> {
        let fetching = std::mem::take(&mut self.fetching);
        self.forget_fetches();
        let mut fetched = HashMap::new();
        for (request, (ticket, keys)) in fetching.into_iter().enumerate() {
            let answer = self.fetcher.as_mut().and_then(|f| f.receive(ticket));
            match answer.filter(|values| values.len() == keys.len()) {
                Some(values) => {
                    fetched.extend(keys.into_iter().zip(values.into_iter().map(Fetched::Value)));
                }
                None => fetched.extend(keys.into_iter().map(|key| (key, Fetched::Failed(request)))),
            }
        }
        fetched
    }

    /// Forgets what was asked ahead and not received (all of it, once
    /// received, or a flush cut short): the answers are dropped when the
    /// next flush receives its own, or with the fetcher.
    fn forget_fetches(&mut self) {
        self.fetch_next.clear();
        self.fetch_asked.clear();
        self.fetching.clear();
    }

    /// Whether this flush holds claims: reservations kept, or claims sent
    /// ahead (their leases are taken when the store answers).
    fn holds_claims(&self) -> bool {
        !self.claimed.is_empty() || matches!(self.claims_ahead, Some(Some(_)))
    }

    /// The keys of `keys` this flush has not claimed or found yet, each
    /// once.
    fn unknown_keys(&self, keys: Vec<StoreKey>) -> Vec<StoreKey> {
        let mut asked = HashSet::new();
        keys.into_iter()
            .filter(|key| {
                let known = matches!(self.prefetched.get(key), Some(Some(_)))
                    || self.claimed.contains_key(key)
                    || self.busy.contains(key);
                !known && asked.insert(*key)
            })
            .collect()
    }

    /// Keeps what claiming `keys` found, `claims` in their order.
    fn keep_claims(&mut self, keys: Vec<StoreKey>, claims: Vec<Claimed>) {
        for (key, claimed) in keys.into_iter().zip(claims) {
            match claimed {
                Claimed::Found(value) => {
                    self.prefetched.insert(key, Some(value));
                }
                // (Asked only while not claimed here: see
                // `unknown_keys` and `settle_claims_ahead`.)
                Claimed::Reserved(reservation) => {
                    debug_assert!(!self.claimed.contains_key(&key), "claimed twice");
                    self.claimed.insert(key, reservation);
                }
                Claimed::Busy => {
                    debug_assert!(!self.claimed.contains_key(&key), "claimed twice");
                    self.busy.insert(key);
                }
            }
        }
    }

    /// Claims the template of store key `key`, whose code this flush
    /// would load or compile, without waiting (see 7 above): whether the
    /// store holds an entry for it (not checked), or another module is
    /// compiling it. An entry found is kept as fetched, a reservation as
    /// claimed. A store that does not reserve keys is only looked at.
    fn claim(&mut self, key: StoreKey) -> Served {
        self.settle_claims_ahead(&key);
        match self.prefetched.get(&key) {
            Some(Some(_)) => return Served::Found,
            // Missing when the flush asked: asked again only to claim it.
            Some(None) if !self.store.reserves() => return Served::No,
            Some(None) | None => {}
        }
        if self.claimed.contains_key(&key) {
            return Served::No;
        }
        if self.busy.contains(&key) {
            return Served::Busy;
        }
        if !self.store.reserves() {
            return match self.store.get(&key) {
                Ok(Some(_)) => Served::Found,
                _ => Served::No,
            };
        }
        match claim(&self.store, key) {
            Ok(Claimed::Found(value)) => {
                self.prefetched.insert(key, Some(value));
                Served::Found
            }
            Ok(Claimed::Reserved(reservation)) => {
                self.claimed.insert(key, reservation);
                Served::No
            }
            Ok(Claimed::Busy) => Served::Busy,
            // Asked again in its turn.
            Err(_) => Served::No,
        }
    }

    /// Notes that an entry was rejected for `rejection`, and says so once
    /// at `warn` level when the first [`REJECTED_ALIKE_TO_WARN`] entries
    /// found were all rejected for it (see 6 above).
    fn note_rejected(&mut self, rejection: Rejection) {
        let Some((reason, count)) = &mut self.rejected_alike else {
            return;
        };
        if *count == 0 || *reason != rejection {
            *reason = rejection;
            *count = 0;
        }
        *count += 1;
        if *count == REJECTED_ALIKE_TO_WARN {
            log::warn!(
                "code store: the first {count} entries found were all rejected ({reason}); \
                 this module compiles what they hold"
            );
            self.rejected_alike = None;
        }
    }
}

/// The store's entry for a function, checked on a flush's thread (see 5
/// above), with the checks of the function that loading it needs.
pub(super) struct CheckedEntry {
    /// The key it was fetched under.
    key: StoreKey,
    /// The fast hash of the exact key of the function it was checked for
    /// (its template and names), checked again at its use.
    exact: u64,
    /// A hash of the bytes checked, checked again against the bytes the
    /// flush holds for the key at its use.
    bytes: u64,
    /// What [`check`](crate::store::load::check) made of it.
    loaded: Result<Loaded, Rejection>,
    /// The function's checks ([`verify::checks_for_entry`]), run where
    /// the entry passed.
    checks: Option<ModuleResult<Checked>>,
}

/// What the fetcher brought for a key asked ahead (see 5 above).
enum Fetched {
    /// The store's value, `None` if it holds none.
    Value(Option<Vec<u8>>),
    /// The request (numbered in the flush) failed: the function asks on
    /// its own.
    Failed(usize),
}

/// The store key of a function's template, computed when its entry was
/// asked for, for the flush's prefetch and its define: used only if the
/// walk it is used with has the same exact key hash as the one it was
/// computed from. (A stale key could only fetch another template's entry,
/// which the template digest then rejects.)
#[derive(Clone, Copy)]
pub(super) struct KnownKey {
    key: StoreKey,
    /// The fast hash of the exact key of the walk it was computed from.
    exact: u64,
}

/// An entry fetched by a flush, to check on its pool for a function.
struct EntryJob<'a> {
    /// The function's record's index in the flush.
    index: usize,
    key: StoreKey,
    bytes: &'a [u8],
    func: &'a Function,
    walk: WalkRef<'a>,
}

impl EntryJob<'_> {
    /// The entry checked as the function's turn would check it, and, if
    /// it passes, the function's checks for it; `None` should either
    /// panic (the turn then checks it again).
    fn check(&self, checks: &Checks<'_>) -> Option<CheckedEntry> {
        catch_unwind(AssertUnwindSafe(|| {
            let loaded = crate::store::load::check(
                self.bytes,
                checks,
                self.walk.template_key(),
                self.walk.names,
            );
            let function_checks = loaded.as_ref().ok().map(|loaded| {
                verify::checks_for_entry(
                    self.func,
                    checks.isa,
                    loaded.verified.as_ref(),
                    Named::of(&self.walk),
                )
            });
            CheckedEntry {
                key: self.key,
                exact: self.walk.fingerprint.fast_hash(),
                bytes: xxh3_64(self.bytes),
                loaded,
                checks: function_checks,
            }
        }))
        .ok()
    }
}

/// The store key of the template of a function walked as `walk`.
fn store_key(context: &CodeContext, walk: &WalkRef<'_>) -> StoreKey {
    StoreKey::of_words(context, walk.template_key())
}

/// The store key of the template of `walk`: `known`, if it was computed
/// from a walk with the same exact key hash (see [`KnownKey`]), else
/// computed now.
fn known_key(context: &CodeContext, walk: &WalkRef<'_>, known: Option<KnownKey>) -> KnownKey {
    let exact = walk.fingerprint.fast_hash();
    known
        .filter(|known| known.exact == exact)
        .unwrap_or_else(|| KnownKey {
            key: store_key(context, walk),
            exact,
        })
}

#[cfg(test)]
mod tests {
    use super::{CLAIM_AHEAD_MAX, CLAIM_AHEAD_MIN, claim_span, claim_spans};

    #[test]
    fn claim_spans_cover_a_flush_and_shrink_toward_its_end_within_bounds() {
        assert_eq!(claim_span(0), CLAIM_AHEAD_MIN);
        assert_eq!(claim_span(1 << 20), CLAIM_AHEAD_MAX);
        assert!(claim_spans(0).is_empty());
        assert_eq!(claim_spans(5), vec![0..5]);
        // Going through a flush as large as the sqlite corpus.
        let functions = 7322;
        let spans = claim_spans(functions);
        assert_eq!(spans[0].start, 0);
        assert_eq!(spans.last().map(|s| s.end), Some(functions));
        assert!(spans.windows(2).all(|w| w[0].end == w[1].start));
        let lens: Vec<usize> = spans.iter().map(|s| s.len()).collect();
        assert!(lens.windows(2).all(|w| w[0] >= w[1]), "{lens:?}");
        assert!(lens[0] > CLAIM_AHEAD_MIN && lens[0] <= CLAIM_AHEAD_MAX);
        assert!(lens.iter().all(|&len| len <= CLAIM_AHEAD_MAX));
        assert_eq!(lens[lens.len() - 2], CLAIM_AHEAD_MIN);
        // Far fewer round trips than a claim every smallest span.
        assert!(
            spans.len() * 3 < functions / CLAIM_AHEAD_MIN,
            "{}",
            spans.len()
        );
    }
}
