//! JIT threads sharing compiled code (`SharedStore`):
//!
//! - `shared_store_lookups/N`: N threads looking up entries of a store that
//!   holds 100,000 templates (hits, as threads that start after the first
//!   see them); criterion reports lookups per second.
//! - `same_functions`: one thread defining 1,000 distinct functions through
//!   a `DedupModule` on a fresh store, against two threads each defining the
//!   same 1,000 through its own module on one shared store. Each template
//!   is compiled once in total either way, so the compile time summed over
//!   both threads should be about one thread's; it is printed at the end,
//!   with the wall times.
//!
//! - `runtimes`: N runtimes starting one program at once (the 1,000
//!   functions), each with its own module: on one `SharedStore` against
//!   each a plain `JITModule`, eager and batch, for N = 2 and the machine's
//!   core count; the wall times, their ratio and the compiles in total.
//!
//! - `warm`: a warm start from a `SharedStore` (every function loaded)
//!   against compiling, per mode and verifier setting.
//!
//! Run with `cargo bench --features tools --bench threads`
//! (`-- runtimes` or `-- warm` for one of the last two alone).

#[allow(dead_code)]
mod common;

use common::distinct_function;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use criterion::{BenchmarkId, Criterion, Throughput};
use jitfold::store::{CodeStore, SharedStore, StoreKey};
use jitfold::{DedupModule, DedupOptions};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const ENTRIES: usize = 100_000;
const LOOKUPS_PER_THREAD: usize = 20_000;
const FUNCTIONS: usize = 1_000;

/// A key that looks like a hash.
fn key(i: usize) -> StoreKey {
    let mut bytes = [0u8; 16];
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
    for chunk in bytes.chunks_mut(8) {
        x = x.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(1);
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    StoreKey::from_bytes(bytes)
}

fn shared_store_lookups(c: &mut Criterion) {
    let store = Arc::new(SharedStore::new());
    let value = vec![0x90u8; 200];
    for i in 0..ENTRIES {
        store.put(&key(i), &value).unwrap();
    }
    let mut group = c.benchmark_group("shared_store_lookups");
    for threads in [1usize, 2, 4] {
        group.throughput(Throughput::Elements((threads * LOOKUPS_PER_THREAD) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(threads), &threads, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let barrier = Arc::new(Barrier::new(n + 1));
                    let handles: Vec<_> = (0..n)
                        .map(|t| {
                            let (store, barrier) = (store.clone(), barrier.clone());
                            std::thread::spawn(move || {
                                barrier.wait();
                                for i in 0..LOOKUPS_PER_THREAD {
                                    let k = key((i * 7919 + t * 104_729) % ENTRIES);
                                    black_box(store.get_or_reserve(&k).unwrap());
                                }
                            })
                        })
                        .collect();
                    barrier.wait();
                    let start = Instant::now();
                    for h in handles {
                        h.join().unwrap();
                    }
                    total += start.elapsed();
                }
                total
            });
        });
    }
    group.finish();
}

/// Defines the 1,000 functions through a module on `store`; returns the
/// compile time the module spent.
fn define_all(store: Arc<SharedStore>) -> Duration {
    define_all_with(store, DedupOptions::default(), true).compile_time
}

/// A JIT builder, with Cranelift's verifier on or off (wasmtime ships
/// with it off).
fn jit_builder(verifier: bool) -> JITBuilder {
    let flag = if verifier { "true" } else { "false" };
    JITBuilder::with_flags(&[("enable_verifier", flag)], default_libcall_names()).unwrap()
}

/// Declares and defines the 1,000 functions in `m` (not finalized).
fn define_functions(m: &mut impl Module) {
    let conv = m.isa().default_call_conv();
    for k in 0..FUNCTIONS {
        let func = distinct_function(k as i64, false, conv);
        let id = m
            .declare_function(&format!("f{k}"), Linkage::Local, &func.signature)
            .unwrap();
        let mut ctx = m.make_context();
        ctx.func = func;
        m.define_function(id, &mut ctx).unwrap();
    }
}

/// Defines the 1,000 functions in a plain `JITModule`, finalized.
fn define_plain(verifier: bool) {
    let mut m = JITModule::new(jit_builder(verifier));
    define_functions(&mut m);
    m.finalize_definitions().unwrap();
}

/// Defines the 1,000 functions through a module with `options` on
/// `store`; returns its statistics.
fn define_all_with(
    store: Arc<SharedStore>,
    options: DedupOptions,
    verifier: bool,
) -> jitfold::Stats {
    let builder = jit_builder(verifier);
    let mut m =
        DedupModule::with_options(builder, options).with_store(store as Arc<dyn CodeStore>, None);
    define_functions(&mut m);
    m.finalize_definitions().unwrap();
    m.stats().clone()
}

fn same_functions(c: &mut Criterion) {
    // Warm up the JIT once (page allocation, lazy statics).
    let _ = JITModule::new(JITBuilder::new(default_libcall_names()).unwrap());
    let mut group = c.benchmark_group("same_functions");
    group.sample_size(10);
    group.bench_function("one_thread", |b| {
        b.iter(|| define_all(Arc::new(SharedStore::new())))
    });
    group.bench_function("two_threads_one_store", |b| b.iter(two_threads));
    group.finish();
    // Compile time summed over modules, one thread against two, best of 5
    // alternating rounds.
    let (mut one, mut two) = (Duration::MAX, Duration::MAX);
    let (mut one_wall, mut two_wall) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        let start = Instant::now();
        one = one.min(define_all(Arc::new(SharedStore::new())));
        one_wall = one_wall.min(start.elapsed());
        let start = Instant::now();
        two = two.min(two_threads());
        two_wall = two_wall.min(start.elapsed());
    }
    println!(
        "same {FUNCTIONS} functions: compile time one thread {:.1} ms, two threads on one \
         store {:.1} ms summed ({:+.1}%); wall {:.1} ms against {:.1} ms",
        one.as_secs_f64() * 1e3,
        two.as_secs_f64() * 1e3,
        (two.as_secs_f64() / one.as_secs_f64() - 1.0) * 100.0,
        one_wall.as_secs_f64() * 1e3,
        two_wall.as_secs_f64() * 1e3,
    );
}

/// Two threads defining the same functions on one store: their compile
/// times summed.
fn two_threads() -> Duration {
    let store = Arc::new(SharedStore::new());
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || define_all(store))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

/// N runtimes starting one program at once (the 1,000 functions), each
/// with its own module: on one `SharedStore` against each a plain
/// `JITModule`, for N = 2 and the machine's core count, eager and batch,
/// Cranelift's verifier on and off.
/// Prints the wall times (best of 3 alternating rounds), their ratio and
/// the compiles summed over the runtimes.
fn runtimes() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut counts = vec![2];
    if cores > 2 {
        counts.push(cores);
    }
    for (n, verifier) in counts.into_iter().flat_map(|n| [(n, true), (n, false)]) {
        for (label, options) in [
            ("eager", DedupOptions::eager()),
            ("batch", DedupOptions::batch()),
        ] {
            let (mut plain, mut shared) = (Duration::MAX, Duration::MAX);
            let mut compiles = 0;
            for _ in 0..3 {
                let start = Instant::now();
                let handles: Vec<_> = (0..n)
                    .map(|_| std::thread::spawn(move || define_plain(verifier)))
                    .collect();
                handles.into_iter().for_each(|h| h.join().unwrap());
                plain = plain.min(start.elapsed());
                let store = Arc::new(SharedStore::new());
                let start = Instant::now();
                let handles: Vec<_> = (0..n)
                    .map(|_| {
                        let store = store.clone();
                        std::thread::spawn(move || define_all_with(store, options, verifier))
                    })
                    .collect();
                compiles = handles
                    .into_iter()
                    .map(|h| h.join().unwrap().compiled)
                    .sum::<u64>();
                shared = shared.min(start.elapsed());
            }
            println!(
                "{n} runtimes, {FUNCTIONS} functions, {label}, verifier {}: plain {:.1} ms \
                 ({} compiles), one shared store {:.1} ms ({compiles} compiles): {:.2}x faster",
                if verifier { "on" } else { "off" },
                plain.as_secs_f64() * 1e3,
                n * FUNCTIONS,
                shared.as_secs_f64() * 1e3,
                plain.as_secs_f64() / shared.as_secs_f64()
            );
        }
    }
}

/// A warm start from a `SharedStore`: one runtime fills the store, then
/// fresh runtimes define the 1,000 functions from it (each loaded, none
/// compiled), against a plain `JITModule` compiling them, eager and batch,
/// Cranelift's verifier on and off. Prints the best times of 5
/// alternating rounds and their ratio. (`JITFOLD_WARM_LOOP=N` repeats the
/// warm side N times more, unprinted, for a profiler;
/// `JITFOLD_WARM_ONLY=eager-off`, say, runs one setting alone.)
fn warm() {
    let repeat: usize = std::env::var("JITFOLD_WARM_LOOP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let only = std::env::var("JITFOLD_WARM_ONLY").ok();
    for verifier in [true, false] {
        for (label, options) in [
            ("eager", DedupOptions::eager()),
            ("batch", DedupOptions::batch()),
        ] {
            let setting = format!("{label}-{}", if verifier { "on" } else { "off" });
            if only.as_ref().is_some_and(|only| *only != setting) {
                continue;
            }
            let store = Arc::new(SharedStore::new());
            define_all_with(store.clone(), options, verifier);
            let (mut plain, mut warm) = (Duration::MAX, Duration::MAX);
            for _ in 0..5 {
                let start = Instant::now();
                define_plain(verifier);
                plain = plain.min(start.elapsed());
                let start = Instant::now();
                let stats = define_all_with(store.clone(), options, verifier);
                warm = warm.min(start.elapsed());
                assert_eq!(stats.loaded, FUNCTIONS as u64, "{stats}");
            }
            for _ in 0..repeat {
                define_all_with(store.clone(), options, verifier);
            }
            println!(
                "warm start, {FUNCTIONS} functions, {label}, verifier {}: plain {:.1} ms, \
                 from a shared store {:.1} ms: {:.3} of plain's time ({:.1} µs a function)",
                if verifier { "on" } else { "off" },
                plain.as_secs_f64() * 1e3,
                warm.as_secs_f64() * 1e3,
                warm.as_secs_f64() / plain.as_secs_f64(),
                warm.as_secs_f64() * 1e6 / FUNCTIONS as f64,
            );
        }
    }
}

fn main() {
    // `-- runtimes`: the runtimes comparison alone.
    if std::env::args().any(|a| a == "runtimes") {
        runtimes();
        return;
    }
    // `-- warm`: the warm start alone.
    if std::env::args().any(|a| a == "warm") {
        warm();
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    shared_store_lookups(&mut c);
    same_functions(&mut c);
    c.final_summary();
    runtimes();
    warm();
}
