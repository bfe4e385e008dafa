//! JIT threads sharing one code store (`SharedStore`): each thread has its
//! own `DedupModule<JITModule>`, every template is compiled once in total,
//! every function returns what plain `JITModule` returns, and a compile
//! that fails or panics on one thread never leaves another waiting.

use crate::common::build::{
    call1, declare, define, emit_call, leaf2, leaves_and_callers, tail_caller, template_key,
    twelve_steps,
};
use cranelift_codegen::ir::{self, InstBuilder};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Module, default_libcall_names};
use jitfold::store::{CodeStore, SharedStore};
use jitfold::{DedupError, DedupModule, DedupOptions, Stats};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// Leaves with distinct constants (one template each) and a caller of
/// each (one template for all callers).
fn leaves() -> i64 {
    if std::env::var_os("JITFOLD_STRESS").is_some() {
        2000
    } else {
        60
    }
}

/// Builds the program in `m`, in an order rotated by `rotate`; returns the
/// ids in one order whatever the order of definition.
fn build<M: Module>(m: &mut M, rotate: usize) -> Vec<FuncId> {
    let mut order: Vec<i64> = (0..leaves()).collect();
    let len = order.len();
    order.rotate_left(rotate % len);
    leaves_and_callers(m, &order, 1000)
}

fn results(ptr: impl Fn(FuncId) -> *const u8, ids: &[FuncId]) -> Vec<i64> {
    ids.iter()
        .flat_map(|&id| [-3, 0, 7].map(|x| call1(ptr(id), x)))
        .collect()
}

fn builder() -> JITBuilder {
    JITBuilder::new(default_libcall_names()).unwrap()
}

/// Runs `threads` threads, each defining the program through its own
/// module on `store`; returns each thread's statistics and results.
fn run_threads(
    threads: usize,
    store: Arc<dyn CodeStore>,
    options: DedupOptions,
) -> Vec<(Stats, Vec<i64>)> {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, barrier) = (store.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut m = DedupModule::with_options(builder(), options).with_store(store, None);
                barrier.wait();
                let ids = build(&mut m, t * 7);
                m.finalize_definitions().unwrap();
                let out = results(|id| m.get_finalized_function(id), &ids);
                (m.stats().clone(), out)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// What every function of the program returns, compiled by plain
/// `JITModule`.
fn expected() -> Vec<i64> {
    let mut m = JITModule::new(builder());
    let ids = build(&mut m, 0);
    m.finalize_definitions().unwrap();
    results(|id| m.get_finalized_function(id), &ids)
}

#[test]
fn every_template_is_compiled_once_across_threads() {
    let expected = expected();
    // The leaves' templates and the callers' one.
    let templates = leaves() as u64 + 1;
    for (threads, options) in [
        (4, DedupOptions::default()),
        (3, DedupOptions::batch()),
        (2, DedupOptions::default().with_reuse(false)),
    ] {
        let store = Arc::new(SharedStore::new());
        let runs = run_threads(threads, store.clone(), options);
        let compiled: u64 = runs.iter().map(|(s, _)| s.compiled).sum();
        assert_eq!(compiled, templates, "{options}: {:?}", store.stats());
        assert_eq!(store.stats().reservations, templates);
        for (stats, out) in &runs {
            assert_eq!(out, &expected, "{options}");
            assert_eq!(stats.store_rejected + stats.store_errors, 0, "{stats}");
        }
    }
}

/// On x86-64, a `return_call` without `preserve_frame_pointers` makes
/// Cranelift panic at emission (see `errors.rs`): every thread that defines
/// it gets the panic as its error, in turn (from `define_function`, or,
/// where its define was left to the flush while another thread compiled
/// it, from `finalize_definitions`), and none waits forever.
#[test]
fn a_panicking_compile_releases_the_threads_waiting_for_it() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let threads = 4;
    let store = Arc::new(SharedStore::new());
    let barrier = Arc::new(Barrier::new(threads));
    let after_all = Arc::new(Barrier::new(threads));
    let (done, finished) = mpsc::channel();
    for _ in 0..threads {
        let (store, barrier, done) = (store.clone(), barrier.clone(), done.clone());
        let after_all = after_all.clone();
        std::thread::spawn(move || {
            let mut m = DedupModule::with_options(builder(), DedupOptions::default())
                .with_store(store as Arc<dyn CodeStore>, None);
            barrier.wait();
            let result = tail_caller(&mut m).and_then(|()| m.finalize_definitions());
            m.take_failed_definitions();
            let panicked = matches!(
                result.as_ref().map_err(DedupError::of),
                Err(Some(DedupError::CraneliftPanic { .. }))
            );
            let _ = done.send(panicked);
            // Every thread gets its error before any defines anything else
            // (which would end a reservation left behind).
            after_all.wait();
            let conv = m.isa().default_call_conv();
            let g = declare(&mut m, "after", conv);
            let defined = define(&mut m, g, |b, _, p| {
                let r = b.ins().iadd_imm_s(p[0], 1);
                b.ins().return_(&[r]);
            });
            let _ = done.send(defined.is_ok());
        });
    }
    for round in ["panicked", "defined a function after the panic"] {
        for _ in 0..threads {
            let ok = finished
                .recv_timeout(Duration::from_secs(30))
                .expect("a thread waits forever for a compile that panicked");
            assert!(ok, "a thread has not {round}");
        }
    }
    // Each thread reserved the panicking template in turn (and `after`'s
    // once).
    assert_eq!(store.stats().reservations, threads as u64 + 1);
}

/// A store that records, in order, what a module asks of a `SharedStore`,
/// and the name of each thread that claims a key in it; its writes wait
/// while the test holds its gate shut.
struct Recording {
    shared: SharedStore,
    log: std::sync::Mutex<Vec<(&'static str, jitfold::store::StoreKey)>>,
    claimed_on: std::sync::Mutex<Vec<Option<String>>>,
    gate: Gate,
    /// Whether its calls say they are round trips, as a Redis server's
    /// are.
    round_trips: bool,
}

impl Recording {
    fn new(shared: SharedStore) -> Self {
        Self {
            shared,
            log: Default::default(),
            claimed_on: Default::default(),
            gate: Gate::default(),
            round_trips: false,
        }
    }

    fn with_round_trips(self) -> Self {
        Self {
            round_trips: true,
            ..self
        }
    }

    fn note(&self, what: &'static str, key: &jitfold::store::StoreKey) {
        self.log.lock().unwrap().push((what, *key));
    }
}

/// Where a [`Recording`] store's writes wait while it is shut (open at
/// first).
#[derive(Default)]
struct Gate {
    shut: std::sync::Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Gate {
    fn set_shut(&self, shut: bool) {
        *self.shut.lock().unwrap() = shut;
        self.changed.notify_all();
    }

    /// Returns once the gate is open.
    fn pass(&self) {
        let shut = self.shut.lock().unwrap();
        drop(self.changed.wait_while(shut, |shut| *shut).unwrap());
    }
}

impl CodeStore for Recording {
    fn get(
        &self,
        key: &jitfold::store::StoreKey,
    ) -> Result<Option<Vec<u8>>, jitfold::store::StoreError> {
        self.shared.get(key)
    }
    fn put(
        &self,
        key: &jitfold::store::StoreKey,
        value: &[u8],
    ) -> Result<(), jitfold::store::StoreError> {
        self.gate.pass();
        self.note("put", key);
        self.shared.put(key, value)
    }
    fn get_or_reserve(
        &self,
        key: &jitfold::store::StoreKey,
    ) -> Result<Option<Vec<u8>>, jitfold::store::StoreError> {
        self.note("wait", key);
        self.shared.get_or_reserve(key)
    }
    fn try_get_or_reserve(
        &self,
        key: &jitfold::store::StoreKey,
    ) -> Result<jitfold::store::Claim, jitfold::store::StoreError> {
        let thread = std::thread::current().name().map(str::to_owned);
        self.claimed_on.lock().unwrap().push(thread);
        self.shared.try_get_or_reserve(key)
    }
    fn reserves(&self) -> bool {
        true
    }
    fn round_trips(&self) -> bool {
        self.round_trips
    }
    fn release(&self, key: &jitfold::store::StoreKey) {
        self.shared.release(key)
    }
}

/// Batch mode on a store whose calls are round trips claims the templates
/// of a flush's first span of functions on the flush's thread and those
/// of the next spans on a thread of its own, while the flush compiles;
/// the modules still divide the compiles (each template compiled once in
/// total), and every function returns what plain code returns.
#[test]
fn a_flush_on_a_store_of_round_trips_claims_ahead_on_a_thread() {
    let expected = expected();
    let store = Arc::new(Recording::new(SharedStore::new()).with_round_trips());
    let runs = run_threads(2, store.clone(), DedupOptions::batch());
    let compiled: u64 = runs.iter().map(|(s, _)| s.compiled).sum();
    assert_eq!(compiled, leaves() as u64 + 1, "{:?}", store.shared.stats());
    for (stats, out) in &runs {
        assert_eq!(out, &expected);
        assert_eq!(stats.store_rejected + stats.store_errors, 0, "{stats}");
    }
    let claimed_on = store.claimed_on.lock().unwrap();
    let on_claimer = claimed_on
        .iter()
        .filter(|name| name.as_deref() == Some("jitfold-claimer"))
        .count();
    assert!(on_claimer > 0, "{claimed_on:?}");
    assert!(on_claimer < claimed_on.len(), "{claimed_on:?}");
}

/// Batch mode divides a program's compiles between the modules sharing a
/// store instead of queueing on each other: a function whose template
/// another module is compiling (here, a key reserved by the test, as
/// another runtime would) is defined after every other function of the
/// flush, which are compiled and stored first; only then does the flush
/// wait for it (and, the other never storing it, compile it itself once
/// the wait ends). On one thread and on two.
#[test]
fn a_flush_defines_what_others_compile_last() {
    use jitfold::plan::Walk;
    use jitfold::store::{CodeContext, StoreKey};
    for threads in [1, 2] {
        let options = DedupOptions::batch().with_threads(threads);
        let recording = Arc::new(Recording::new(
            SharedStore::new().with_max_wait(Duration::from_millis(200)),
        ));
        // The key of the third leaf's template (`x * 5 + 2000`, as
        // `leaves_and_callers` defines it).
        let mut probe = JITModule::new(builder());
        let context = CodeContext::of(probe.isa());
        let conv = probe.isa().default_call_conv();
        let id = declare(&mut probe, "leaf_probe", conv);
        let third = crate::common::build::built(&mut probe, id, |b, _, p| {
            let t = b.ins().imul_imm_s(p[0], 3 + 2);
            let r = b.ins().iadd_imm_s(t, 1000 * 2);
            b.ins().return_(&[r]);
        });
        let walk = Walk::of(&mut jitfold::Fingerprinter::new(), &third);
        let held = StoreKey::of(&context, &walk.fingerprint.to_template());
        // Another runtime holds it.
        assert_eq!(recording.shared.get_or_reserve(&held).unwrap(), None);
        let mut m = DedupModule::with_options(builder(), options)
            .with_store(recording.clone() as Arc<dyn CodeStore>, None);
        let order: Vec<i64> = (0..6).collect();
        let defined = leaves_and_callers(&mut m, &order, 1000);
        m.finalize_definitions().unwrap();
        let log = recording.log.lock().unwrap().clone();
        let waited = log
            .iter()
            .position(|&(what, key)| what == "wait" && key == held)
            .unwrap_or_else(|| panic!("{threads} threads: never waited for it: {log:?}"));
        let puts_before = log[..waited].iter().filter(|(w, _)| *w == "put").count();
        // Six leaves and one callers' template; all but the held one stored
        // before the wait.
        assert_eq!(puts_before, 6, "{threads} threads: {log:?}");
        assert_eq!(m.stats().compiled, 7, "{threads} threads: {}", m.stats());
        let expected: Vec<i64> = (0..6).map(|k| 4 * (3 + k) + 1000 * k).collect();
        let got: Vec<i64> = defined[..6]
            .iter()
            .map(|&id| call1(m.get_finalized_function(id), 4))
            .collect();
        assert_eq!(got, expected, "{threads} threads");
    }
}

/// A module holding claims never waits for another module (which may be
/// waiting for one of them): on two threads, a flush claims the templates
/// it compiles on them, and a root of its plan whose template another
/// module is compiling is compiled here too instead of waited for (the
/// store's wait, a minute here, would otherwise pass first).
#[test]
fn a_module_holding_claims_does_not_wait_for_another() {
    use jitfold::plan::Walk;
    use jitfold::store::{CodeContext, StoreKey};
    let recording = Arc::new(Recording::new(
        SharedStore::new().with_max_wait(Duration::from_secs(60)),
    ));
    let twin = |m: &mut JITModule| {
        let conv = m.isa().default_call_conv();
        let id = declare(m, "twin_probe", conv);
        crate::common::build::built(m, id, |b, _, p| {
            let r = b.ins().imul_imm_s(p[0], 77);
            b.ins().return_(&[r]);
        })
    };
    let mut probe = JITModule::new(builder());
    let context = CodeContext::of(probe.isa());
    let walk = Walk::of(&mut jitfold::Fingerprinter::new(), &twin(&mut probe));
    let held = StoreKey::of(&context, &walk.fingerprint.to_template());
    assert_eq!(recording.shared.get_or_reserve(&held).unwrap(), None);
    let options = DedupOptions::batch().with_threads(2);
    let mut m = DedupModule::with_options(builder(), options)
        .with_store(recording.clone() as Arc<dyn CodeStore>, None);
    // Twins (the first is the root of the other), then other functions.
    let conv = m.isa().default_call_conv();
    let twins: Vec<FuncId> = (0..2)
        .map(|i| {
            let id = declare(&mut m, &format!("twin{i}"), conv);
            define(&mut m, id, |b, _, p| {
                let r = b.ins().imul_imm_s(p[0], 77);
                b.ins().return_(&[r]);
            })
            .unwrap();
            id
        })
        .collect();
    let order: Vec<i64> = (0..6).collect();
    leaves_and_callers(&mut m, &order, 1000);
    m.finalize_definitions().unwrap();
    let log = recording.log.lock().unwrap().clone();
    assert!(
        !log.iter().any(|&(what, key)| what == "wait" && key == held),
        "waited: {log:?}"
    );
    for &id in &twins {
        assert_eq!(call1(m.get_finalized_function(id), 3), 231);
    }
}

/// An `i64` plus an `i32`: the verifier refuses it.
fn invalid<M>(b: &mut cranelift_frontend::FunctionBuilder, _: &mut M, p: &[ir::Value]) {
    let small = b.ins().iconst(ir::types::I32, 1);
    let r = b.ins().iadd(p[0], small);
    b.ins().return_(&[r]);
}

/// Eager mode does not wait for another module either: a function whose
/// template another module is compiling (a key the test holds, as another
/// runtime would) is left to `finalize_definitions`, after every other
/// function was compiled and stored; so is a later twin of it, even once
/// the key is free (which function is canonical does not depend on
/// timing), and the flush makes the twin its duplicate. Results are plain
/// Cranelift's.
#[test]
fn an_eager_define_leaves_what_another_module_compiles_to_finalize() {
    let recording = Arc::new(Recording::new(
        SharedStore::new().with_max_wait(Duration::from_secs(60)),
    ));
    let held = template_key(leaf2);
    assert_eq!(recording.shared.get_or_reserve(&held).unwrap(), None);
    let mut m = DedupModule::with_options(builder(), DedupOptions::eager())
        .with_store(recording.clone() as Arc<dyn CodeStore>, None);
    let order: Vec<i64> = (0..6).collect();
    let defined = leaves_and_callers(&mut m, &order, 1000);
    assert_eq!(m.stats().store_deferred, 1, "{}", m.stats());
    // Five leaves and the callers' template compiled (their entries sent
    // to the store's writer, not waited for), nothing waited for.
    assert_eq!(m.stats().compiled, 6, "{}", m.stats());
    let log = recording.log.lock().unwrap().clone();
    assert!(!log.iter().any(|(w, _)| *w == "wait"), "{log:?}");
    // The other module gives up; a twin defined now waits for the flush too.
    recording.shared.release(&held);
    let conv = m.isa().default_call_conv();
    let twin = declare(&mut m, "twin", conv);
    define(&mut m, twin, leaf2).unwrap();
    assert_eq!(m.stats().store_deferred, 2, "{}", m.stats());
    m.finalize_definitions().unwrap();
    let stats = m.stats();
    assert_eq!(stats.compiled, 7, "{stats}");
    assert_eq!(stats.trampolined + stats.aliased, 1, "{stats}");
    // Every template stored by the flush's end.
    let log = recording.log.lock().unwrap().clone();
    assert_eq!(
        log.iter().filter(|(w, _)| *w == "put").count(),
        7,
        "{log:?}"
    );
    let expected: Vec<i64> = (0..6).map(|k| 4 * (3 + k) + 1000 * k).collect();
    let got: Vec<i64> = defined[..6]
        .iter()
        .map(|&id| call1(m.get_finalized_function(id), 4))
        .collect();
    assert_eq!(got, expected);
    let callers: Vec<i64> = defined[6..]
        .iter()
        .map(|&id| call1(m.get_finalized_function(id), 3))
        .collect();
    assert_eq!(callers, expected);
    assert_eq!(call1(m.get_finalized_function(twin), 4), 2020);
}

/// What changes for the caller of an eager define left to the flush: its
/// failure (here, the verifier's) is the error of `finalize_definitions`,
/// listed by `failed_definitions`, and the id may be defined again.
#[test]
fn an_eager_define_left_to_finalize_fails_there() {
    let recording = Arc::new(Recording::new(
        SharedStore::new().with_max_wait(Duration::from_millis(100)),
    ));
    let held = template_key(invalid);
    assert_eq!(recording.shared.get_or_reserve(&held).unwrap(), None);
    let mut m = DedupModule::with_options(builder(), DedupOptions::eager())
        .with_store(recording.clone() as Arc<dyn CodeStore>, None);
    let conv = m.isa().default_call_conv();
    let id = declare(&mut m, "invalid", conv);
    define(&mut m, id, invalid).unwrap();
    assert_eq!(m.stats().store_deferred, 1, "{}", m.stats());
    let error = m.finalize_definitions().unwrap_err();
    assert!(error.to_string().contains("erifier"), "{error}");
    assert_eq!(m.failed_definitions().len(), 1);
    assert_eq!(m.failed_definitions()[0].0, id);
    // Defined again, correctly, it runs.
    define(&mut m, id, |b, _, p| {
        let r = b.ins().iadd_imm_s(p[0], 1);
        b.ins().return_(&[r]);
    })
    .unwrap();
    m.finalize_definitions().unwrap();
    assert_eq!(call1(m.get_finalized_function(id), 4), 5);
}

/// Calls `h1` and `h2` (declared here, where they are not yet) with its
/// argument; returns the sum.
fn calls_two<M: Module>(b: &mut cranelift_frontend::FunctionBuilder, m: &mut M, p: &[ir::Value]) {
    let conv = m.isa().default_call_conv();
    let (h1, h2) = (declare(m, "h1", conv), declare(m, "h2", conv));
    let x = emit_call(b, m, h1, p[0]);
    let y = emit_call(b, m, h2, p[0]);
    let r = b.ins().iadd(x, y);
    b.ins().return_(&[r]);
}

/// Returns the address of `h2` (declared here, where it is not yet) plus
/// its argument.
fn address_of_h2<M: Module>(
    b: &mut cranelift_frontend::FunctionBuilder,
    m: &mut M,
    p: &[ir::Value],
) {
    let conv = m.isa().default_call_conv();
    let h2 = declare(m, "h2", conv);
    let h2 = m.declare_func_in_func(h2, b.func);
    let address = b.ins().func_addr(ir::types::I64, h2);
    let r = b.ins().iadd(address, p[0]);
    b.ins().return_(&[r]);
}

/// What the tests below share: an eager module (with `options`) on
/// a store holding the key of `body`'s template, as another runtime
/// compiling it would, defines `f` (`body`, left to the flush), then `h1`
/// and `h2` (`leaf2` each: `h2` a duplicate of `h1`). Returns the store,
/// the key held, the module, `f` and `h2`.
fn left_before_a_duplicate(
    options: DedupOptions,
    body: fn(&mut cranelift_frontend::FunctionBuilder, &mut DedupModule<JITModule>, &[ir::Value]),
    key: jitfold::store::StoreKey,
) -> (Arc<SharedStore>, DedupModule<JITModule>, FuncId, FuncId) {
    let shared = Arc::new(SharedStore::new().with_max_wait(Duration::from_secs(60)));
    assert_eq!(shared.get_or_reserve(&key).unwrap(), None);
    let mut m = DedupModule::with_options(builder(), options).with_store(shared.clone(), None);
    let conv = m.isa().default_call_conv();
    let f = declare(&mut m, "f", conv);
    define(&mut m, f, body).unwrap();
    assert_eq!(m.stats().store_deferred, 1, "{}", m.stats());
    let (h1, h2) = (declare(&mut m, "h1", conv), declare(&mut m, "h2", conv));
    define(&mut m, h1, leaf2).unwrap();
    define(&mut m, h2, leaf2).unwrap();
    (shared, m, f, h2)
}

/// An eager define left to the flush keeps the template it was left for:
/// the flush does not rewrite its calls of duplicates defined since (here
/// `h2`, a duplicate of `h1`, both defined after the caller, which would
/// make the caller another template), so it loads what the runtime that
/// compiled that template stored, instead of compiling a template of its
/// own (two runtimes would compile the caller twice in total).
#[test]
fn an_eager_define_left_to_finalize_loads_the_template_it_was_left_for() {
    let held = template_key(calls_two::<JITModule>);
    let (shared, mut m, caller, h2) =
        left_before_a_duplicate(DedupOptions::eager(), calls_two, held);
    // The other runtime, whose key it was, compiles the program as the
    // user wrote it, and stores the caller's template.
    shared.release(&held);
    let mut other = DedupModule::with_options(builder(), DedupOptions::eager())
        .with_store(shared.clone(), None);
    let conv = other.isa().default_call_conv();
    let other_caller = declare(&mut other, "caller", conv);
    define(&mut other, other_caller, calls_two).unwrap();
    assert_eq!(other.stats().compiled, 1, "{}", other.stats());
    other.wait_for_store_writes();
    assert!(shared.get(&held).unwrap().is_some());
    m.finalize_definitions().unwrap();
    let stats = m.stats();
    assert_eq!((stats.compiled, stats.loaded), (1, 1), "{stats}");
    assert_eq!(call1(m.get_finalized_function(caller), 4), 2 * 2020);
    assert_eq!(call1(m.get_finalized_function(h2), 4), 2020);
}

/// A function an eager define left to the flush, kept as it was, uses the
/// address of `h2` as data; `h2`, defined after it as a duplicate (where
/// duplicates may share addresses), keeps its own address then (as it
/// would, had the function been defined when it was left), so that the
/// address the function computes is the one the module gives for `h2`.
#[test]
fn an_eager_define_left_to_finalize_keeps_the_addresses_it_uses() {
    let held = template_key(address_of_h2::<JITModule>);
    // Duplicates may share their canonical function's address.
    let options = DedupOptions::eager().with_distinct_addresses(false);
    let (shared, mut m, user, h2) = left_before_a_duplicate(options, address_of_h2, held);
    assert_eq!(m.address_of(h2), Some(h2));
    shared.release(&held);
    m.finalize_definitions().unwrap();
    let address = m.get_finalized_function(h2) as i64;
    assert_eq!(call1(m.get_finalized_function(user), 0), address);
    assert_eq!(call1(address as *const u8, 4), 2020);
}

/// Twelve steps on the argument, times `c`, plus what `callee` (declared
/// here) returns for it: one shape for similar merging, whatever `c` and
/// the callee.
fn steps_calling<M: Module>(
    b: &mut cranelift_frontend::FunctionBuilder,
    m: &mut M,
    p: &[ir::Value],
    callee: &str,
    c: i64,
) {
    let conv = m.isa().default_call_conv();
    let callee = declare(m, callee, conv);
    let steps = twelve_steps(b, p[0]);
    let scaled = b.ins().imul_imm_s(steps, c);
    let called = emit_call(b, m, callee, p[0]);
    let r = b.ins().iadd(scaled, called);
    b.ins().return_(&[r]);
}

/// [`steps_calling`] `h1`, times 3.
fn steps_calling_h1<M: Module>(
    b: &mut cranelift_frontend::FunctionBuilder,
    m: &mut M,
    p: &[ir::Value],
) {
    steps_calling(b, m, p, "h1", 3);
}

/// [`steps_calling`] `h2`, times 5.
fn steps_calling_h2<M: Module>(
    b: &mut cranelift_frontend::FunctionBuilder,
    m: &mut M,
    p: &[ir::Value],
) {
    steps_calling(b, m, p, "h2", 5);
}

/// A function an eager define left to the flush, kept as it was, calls
/// `h2`, a duplicate defined after it that shares `h1`'s address (nothing
/// took `h2`'s); no entry comes for it, and at the flush it becomes a
/// thunk of a similar body, passing its callee's address: it passes the
/// address the module gave `h2` (`h1`'s), and `h2` keeps sharing it, as
/// when any eager define passes it.
#[test]
fn a_thunk_made_for_a_define_left_to_finalize_passes_the_addresses_the_module_gave() {
    let held = template_key(steps_calling_h2::<JITModule>);
    let options = DedupOptions::eager()
        .with_distinct_addresses(false)
        .with_similar(jitfold::similar::SimilarOptions::default());
    let (shared, mut m, f, h2) = left_before_a_duplicate(options, steps_calling_h2, held);
    let conv = m.isa().default_call_conv();
    let h1 = declare(&mut m, "h1", conv);
    assert_eq!(m.address_of(h2), Some(h1));
    // The shape's first member, compiled now; `f` is merged with it at
    // the flush.
    let g = declare(&mut m, "g", conv);
    define(&mut m, g, steps_calling_h1).unwrap();
    assert_eq!(m.stats().compiled, 2, "{}", m.stats());
    // It gives up without storing an entry.
    shared.release(&held);
    m.finalize_definitions().unwrap();
    let stats = m.stats();
    assert_eq!(
        (stats.similar_groups, stats.similar_merged),
        (1, 1),
        "{stats}"
    );
    assert_eq!(m.address_of(h2), Some(h1), "{stats}");
    let (f_ptr, g_ptr) = (m.get_finalized_function(f), m.get_finalized_function(g));
    assert_eq!(m.get_finalized_function(h2), m.get_finalized_function(h1));
    let steps = |x: i64| (1..=12).fold(x, |a, i| a.wrapping_mul(x).wrapping_add(i));
    for x in [0, 4, -3] {
        assert_eq!(call1(g_ptr, x), steps(x).wrapping_mul(3) + 5 * x + 2000);
        assert_eq!(call1(f_ptr, x), steps(x).wrapping_mul(5) + 5 * x + 2000);
    }
}

/// An eager define on a store that reserves keys waits for no write:
/// one that compiles sends its entry to the module's writer, and one
/// that holds the entry it loads (found when it claimed the template)
/// waits for nobody; only a define that asks the store, and may wait
/// there for another module, writes what others may be waiting for
/// first. Here the module's writes wait at a gate: a compiling define,
/// then one loading an entry another runtime stored, return while the
/// first one's write is still held there (a watchdog opens the gate
/// after 30 seconds, failing the test). Results are plain Cranelift's.
#[test]
fn a_define_that_holds_its_entry_does_not_wait_for_writes() {
    let recording = Arc::new(Recording::new(
        SharedStore::new().with_max_wait(Duration::from_secs(60)),
    ));
    // Another runtime stored `leaf2`'s code.
    let mut other = DedupModule::with_options(builder(), DedupOptions::eager())
        .with_store(recording.clone() as Arc<dyn CodeStore>, None);
    let conv = other.isa().default_call_conv();
    let id = declare(&mut other, "leaf2", conv);
    define(&mut other, id, leaf2).unwrap();
    other.finalize_definitions().unwrap();
    assert_eq!(other.stats().store_writes, 1, "{}", other.stats());

    recording.gate.set_shut(true);
    let mut m = DedupModule::with_options(builder(), DedupOptions::eager())
        .with_store(recording.clone() as Arc<dyn CodeStore>, None);
    let (done, watched) = mpsc::channel::<()>();
    let watchdog = {
        let recording = recording.clone();
        std::thread::spawn(move || {
            let timed_out = watched.recv_timeout(Duration::from_secs(30)).is_err();
            recording.gate.set_shut(false);
            timed_out
        })
    };
    // Compiled: its write waits at the gate.
    let compiled = declare(&mut m, "compiled", conv);
    define(&mut m, compiled, |b, _, p| {
        let t = b.ins().imul_imm_s(p[0], 7);
        b.ins().return_(&[t]);
    })
    .unwrap();
    let loaded = declare(&mut m, "loaded", conv);
    define(&mut m, loaded, leaf2).unwrap();
    // (Fails once the watchdog has given up.)
    let _ = done.send(());
    assert!(
        !watchdog.join().unwrap(),
        "an eager define waited for the module's writes"
    );
    let stats = m.stats().clone();
    assert_eq!((stats.compiled, stats.loaded), (1, 1), "{stats}");
    m.finalize_definitions().unwrap();
    assert_eq!(m.stats().store_writes, 1, "{}", m.stats());
    assert_eq!(call1(m.get_finalized_function(compiled), 3), 21);
    assert_eq!(call1(m.get_finalized_function(loaded), 4), 2020);
}
