//! End-to-end JIT throughput, from `ir::Function` to callable pointer:
//! `DedupModule<JITModule>` (eager) against plain `JITModule`, measured in
//! the same run, on workloads with 0%, 50% and 90% duplicates (duplicates
//! are renumbered copies of earlier functions). Each run declares, defines
//! and finalizes the functions and gets every pointer, in a module built
//! before the clock starts, from copies of the functions made before it
//! starts (see [`time_plain`]).
//!
//! Run with `cargo bench --bench jit`; the ratios are printed at the end.
//! Whole-module timings on a noisy machine vary by more than the 0%
//! overhead being measured, so the same two ways are also run alternately,
//! plain and jitfold (in turns, one first, then the other), [`ROUNDS`]
//! times per workload: the best time of each is compared, and so is each
//! adjacent pair (the median of the pairs' ratios, which a machine that
//! slows down for a while between pairs does not move).
//! `cargo bench --bench jit -- none` prints only those, with Cranelift's
//! verifier on (its default) and off (as wasmtime ships).
//!
//! Batch mode on one and on two threads
//! ([`DedupOptions::threads`](jitfold::DedupOptions)) is measured the same
//! way on the 0% workload, against plain `JITModule` in the same run
//! (`jit/batch1/0`, `jit/batch2/0`); `cargo bench --bench jit -- batch`
//! runs only those, and prints the load average before and after, since
//! two threads only show on cores nobody else uses, and the most two
//! threads can give on the machine: two plain modules compiling at once
//! against one alone.
//!
//! `JITFOLD_JIT_PROFILE=SIDE:RUNS` (`SIDE` `plain` or `jitfold`, eager)
//! runs that side alone `RUNS` times on the 0% workload with the verifier
//! off, and nothing else, for a profiler (under `perf record`, through
//! `env -u PERF_BUILDID_DIR`, as the compare bench's docs say).

use cranelift_codegen::Context;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::CallConv;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
#[allow(dead_code)]
mod common;

use common::{Spread, load_average, mean_ns};
use criterion::{BenchmarkId, Criterion, Throughput};
use jitfold::{DedupModule, DedupOptions};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const FUNCTIONS: usize = 300;

fn workload(duplicate_percent: usize, call_conv: CallConv) -> Vec<Function> {
    common::workload(FUNCTIONS, duplicate_percent, true, call_conv)
}

/// What one run hands to the module, made before the clock starts: the
/// functions (a runtime has each one in hand once, so copying them out of
/// the workload is not part of the way to a pointer) and their names.
struct Inputs {
    funcs: Vec<Function>,
    names: Vec<String>,
}

impl Inputs {
    fn of(funcs: &[Function]) -> Self {
        Self {
            funcs: funcs.to_vec(),
            names: (0..funcs.len()).map(|i| format!("f{i}")).collect(),
        }
    }
}

/// Declares and defines every function; returns their ids.
fn jit_all<M: Module>(m: &mut M, inputs: Inputs) -> Vec<cranelift_module::FuncId> {
    let mut ids = Vec::with_capacity(inputs.funcs.len());
    let mut ctx = Context::new();
    for (name, func) in inputs.names.iter().zip(inputs.funcs) {
        let id = m
            .declare_function(name, Linkage::Local, &func.signature)
            .unwrap();
        ctx.clear();
        ctx.func = func;
        m.define_function(id, &mut ctx).unwrap();
        ids.push(id);
    }
    ids
}

/// Whether Cranelift's verifier runs (its default, on; wasmtime ships with
/// it off): the alternating comparisons run in both settings.
static VERIFIER: AtomicBool = AtomicBool::new(true);

fn builder() -> JITBuilder {
    let verifier = if VERIFIER.load(Ordering::Relaxed) {
        "true"
    } else {
        "false"
    };
    JITBuilder::with_flags(
        &[("opt_level", "speed"), ("enable_verifier", verifier)],
        default_libcall_names(),
    )
    .unwrap()
}

/// One run of plain `JITModule`: declare, define, finalize and get every
/// pointer. The module and the [`Inputs`] are made before the clock starts
/// and the module's memory is freed after it stops: a runtime builds one
/// module for many functions, so none of these is part of the way from
/// `ir::Function` to callable pointer, and counting them would charge a
/// constant to the run that compiles fewer functions.
fn time_plain(funcs: &[Function]) -> Duration {
    let inputs = Inputs::of(funcs);
    let mut m = JITModule::new(builder());
    let start = Instant::now();
    let ids = jit_all(&mut m, inputs);
    m.finalize_definitions().unwrap();
    for id in ids {
        black_box(m.get_finalized_function(id));
    }
    let elapsed = start.elapsed();
    // SAFETY: no pointer into this module's code is used after.
    unsafe { m.free_memory() };
    elapsed
}

/// [`time_plain`] through jitfold.
fn time_jitfold(funcs: &[Function]) -> Duration {
    time_dedup(funcs, DedupOptions::default()).0
}

/// [`time_plain`] through jitfold in batch mode on one thread.
fn time_batch1(funcs: &[Function]) -> Duration {
    time_dedup(funcs, DedupOptions::batch()).0
}

/// [`time_plain`] through jitfold in batch mode on two threads.
fn time_batch2(funcs: &[Function]) -> Duration {
    time_dedup(funcs, DedupOptions::batch().with_threads(2)).0
}

/// [`time_plain`] through jitfold with `options`; also the module's stats.
fn time_dedup(funcs: &[Function], options: DedupOptions) -> (Duration, jitfold::Stats) {
    let inputs = Inputs::of(funcs);
    let mut m = DedupModule::wrap(JITModule::new(builder()), options);
    let start = Instant::now();
    let ids = jit_all(&mut m, inputs);
    m.finalize_definitions().unwrap();
    for id in ids {
        black_box(m.get_finalized_function(id));
    }
    let elapsed = start.elapsed();
    let stats = m.stats().clone();
    // SAFETY: as above.
    unsafe { m.into_inner().free_memory() };
    (elapsed, stats)
}

/// Criterion's measurement of `iters` runs of `run`.
fn iterated(iters: u64, run: fn(&[Function]) -> Duration, funcs: &[Function]) -> Duration {
    (0..iters).map(|_| run(funcs)).sum()
}

/// Alternating runs per workload.
const ROUNDS: usize = 101;

/// Over `rounds` alternating rounds of plain and jitfold
/// (`time_jitfold`), one run of each: side 0 is plain, the baseline, and
/// side 1 jitfold (see [`common::alternate`]).
fn alternating(
    funcs: &[Function],
    rounds: usize,
    time_jitfold: fn(&[Function]) -> Duration,
) -> Spread {
    common::alternate(2, rounds, 0, |side| match side {
        0 => time_plain(funcs),
        _ => time_jitfold(funcs),
    })
}

/// The benchmark name filter given on the command line, if any (the first
/// argument that is not an option, as criterion reads it).
fn filter() -> Option<String> {
    std::env::args().skip(1).find(|a| !a.starts_with('-'))
}

/// Prints what [`alternating`] measured for `label`: best of each side,
/// their ratio, and the median over the rounds of jitfold's time over
/// plain's.
fn print_alternating(label: &str, spread: Spread) {
    println!(
        "{label}, alternating, best of {ROUNDS}: plain {:.2} ms, jitfold {:.2} ms, jitfold/plain time {:.3} ({:.2}x faster); median of pairs {:.3} ({:.2}x faster)",
        spread.best[0].as_secs_f64() * 1e3,
        spread.best[1].as_secs_f64() * 1e3,
        spread.best_ratio[1],
        1.0 / spread.best_ratio[1],
        spread.median_ratio[1],
        1.0 / spread.median_ratio[1]
    );
}

/// `JITFOLD_JIT_PROFILE=SIDE:RUNS`, read: the side to run alone and how
/// many times.
fn profiled_side() -> Option<(String, usize)> {
    let text = std::env::var("JITFOLD_JIT_PROFILE").ok()?;
    let parsed = text
        .split_once(':')
        .and_then(|(side, runs)| Some((side.to_string(), runs.parse().ok()?)))
        .filter(|(side, runs)| ["plain", "jitfold"].contains(&side.as_str()) && *runs > 0);
    assert!(
        parsed.is_some(),
        "JITFOLD_JIT_PROFILE={text}: SIDE:RUNS, SIDE plain or jitfold, RUNS at least 1"
    );
    parsed
}

fn main() {
    let call_conv = JITModule::new(builder()).isa().default_call_conv();
    if let Some((side, runs)) = profiled_side() {
        VERIFIER.store(false, Ordering::Relaxed);
        let funcs = workload(0, call_conv);
        let run = if side == "plain" {
            time_plain
        } else {
            time_jitfold
        };
        let mut times: Vec<Duration> = (0..runs).map(|_| run(&funcs)).collect();
        times.sort();
        eprintln!(
            "{side}, 0% duplicates, verifier off: median {:.2} ms of {runs} runs",
            times[runs / 2].as_secs_f64() * 1e3
        );
        return;
    }
    let filter = filter();
    let batch_only = filter.as_deref().is_some_and(|f| f.contains("batch"));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{cores} cores; load average {}", load_average());
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let mut group = c.benchmark_group("jit");
    group.throughput(Throughput::Elements(FUNCTIONS as u64));
    let funcs = workload(0, call_conv);
    group.bench_with_input(BenchmarkId::new("batch1", 0), &funcs, |b, funcs| {
        b.iter_custom(|iters| iterated(iters, time_batch1, funcs))
    });
    group.bench_with_input(BenchmarkId::new("batch2", 0), &funcs, |b, funcs| {
        b.iter_custom(|iters| iterated(iters, time_batch2, funcs))
    });
    for percent in [0usize, 50, 90] {
        let funcs = workload(percent, call_conv);
        group.bench_with_input(BenchmarkId::new("plain", percent), &funcs, |b, funcs| {
            b.iter_custom(|iters| iterated(iters, time_plain, funcs))
        });
        group.bench_with_input(BenchmarkId::new("jitfold", percent), &funcs, |b, funcs| {
            b.iter_custom(|iters| iterated(iters, time_jitfold, funcs))
        });
    }
    group.finish();
    c.final_summary();

    let all = filter.is_none() || filter.as_deref() == Some("none");
    if all || batch_only {
        let (_, stats) = time_dedup(&funcs, DedupOptions::batch().with_threads(2));
        println!(
            "batch, 2 threads: {} compiled, per thread {:?}, parallel phase {:.2} ms, compile time {:.2} ms summed",
            stats.compiled,
            stats.compiles_per_thread,
            stats.parallel_time.as_secs_f64() * 1e3,
            stats.compile_time.as_secs_f64() * 1e3
        );
        for (name, time) in [
            (
                "batch, 1 thread ",
                time_batch1 as fn(&[Function]) -> Duration,
            ),
            ("batch, 2 threads", time_batch2),
        ] {
            let pairs = alternating(&funcs, ROUNDS, time);
            print_alternating(&format!(" 0% duplicates, {name}"), pairs);
        }
        // What two threads can give on this machine at best: two plain
        // modules compiling the workload at once, against one alone.
        let mut ceilings: Vec<f64> = (0..ROUNDS / 2)
            .map(|_| {
                let alone = time_plain(&funcs);
                let both = std::thread::scope(|s| {
                    let other = s.spawn(|| time_plain(&funcs));
                    let mine = time_plain(&funcs);
                    mine.max(other.join().unwrap())
                });
                2.0 * alone.as_secs_f64() / both.as_secs_f64()
            })
            .collect();
        ceilings.sort_by(f64::total_cmp);
        println!(
            "two plain JITModules at once on two threads: {:.2}x the throughput of one (median of {}), the most two threads give here",
            ceilings[ceilings.len() / 2],
            ceilings.len()
        );
        println!("load average after: {}", load_average());
    }
    if batch_only {
        return;
    }

    for verifier in [true, false] {
        VERIFIER.store(verifier, Ordering::Relaxed);
        let setting = if verifier { "on" } else { "off" };
        for percent in [0usize, 50, 90] {
            let pairs = alternating(&workload(percent, call_conv), ROUNDS, time_jitfold);
            print_alternating(
                &format!("{percent:>2}% duplicates, verifier {setting}"),
                pairs,
            );
        }
    }
    VERIFIER.store(true, Ordering::Relaxed);

    for percent in [0usize, 50, 90] {
        if let (Some(plain), Some(dedup)) = (
            mean_ns(&["jit", "plain", &percent.to_string()]),
            mean_ns(&["jit", "jitfold", &percent.to_string()]),
        ) {
            let per_sec = |ns: f64| FUNCTIONS as f64 / (ns * 1e-9);
            println!(
                "{percent:>2}% duplicates: plain {:.0} functions/s, jitfold {:.0} functions/s, jitfold/plain time {:.3} ({:.2}x faster)",
                per_sec(plain),
                per_sec(dedup),
                dedup / plain,
                plain / dedup
            );
        }
    }
}
