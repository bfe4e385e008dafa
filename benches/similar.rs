//! What similar-function merging costs at run time and saves at compile
//! time, on the demo workload (`jitfold::demo`), in the same run.
//!
//! - Calls: every `hash<T>` of the workload (its instantiations for one
//!   machine type differ only in their salt constants, and merge into one
//!   body per machine type behind thunks), called on every input
//!   [`CALLS`] times, through the plain `JITModule`'s code and through
//!   the code of a `DedupModule` in batch mode with similar-function
//!   merging: the thunk's extra call, and the body's parameters in
//!   registers, against the original.
//! - Compile: the whole workload to callable pointers, in batch mode with
//!   and without similar-function merging.
//!
//! Both sides alternate ([`ROUNDS`] rounds, `common::alternate`); printed
//! are the best of each side, the ratio of the bests and the median of the
//! rounds' ratios.
//! Run with `cargo bench --features tools --bench similar`.

#[allow(dead_code)]
mod common;

use cranelift_jit::JITModule;
use cranelift_module::FuncId;
use jitfold::demo::{self, INPUTS};
use jitfold::{DedupModule, DedupOptions, similar::SimilarOptions};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Pairs of measurements of each comparison.
const ROUNDS: usize = 31;
/// Calls of each function on each input per measurement.
const CALLS: usize = 2_000;
/// The workload's size (as `jitfold demo`'s defaults).
const UNITS: usize = 4;
const STUBS: usize = 200;

type Entry = extern "C" fn(i64, i64) -> i64;

/// Entry points of the `hash<T>` functions of the first unit, and the
/// module that keeps them alive.
struct Hashes<M> {
    _module: M,
    entries: Vec<Entry>,
}

fn entries(workload: &demo::Workload, get: impl Fn(FuncId) -> *const u8) -> Vec<Entry> {
    workload
        .functions
        .iter()
        .filter(|(name, _)| name.starts_with("unit0::hash<"))
        // SAFETY: finalized code of the workload's functions, all of
        // signature `(i64, i64) -> i64` in the host's default convention.
        .map(|&(_, id)| unsafe { std::mem::transmute::<*const u8, Entry>(get(id)) })
        .collect()
}

fn plain_hashes() -> Hashes<JITModule> {
    let mut m = JITModule::new(demo::jit_builder().unwrap());
    let workload = demo::build(&mut m, UNITS, STUBS).unwrap();
    m.finalize_definitions().unwrap();
    let entries = entries(&workload, |id| m.get_finalized_function(id));
    Hashes {
        _module: m,
        entries,
    }
}

fn similar_options() -> DedupOptions {
    DedupOptions::batch().with_similar(SimilarOptions::DEFAULT)
}

fn merged_hashes() -> Hashes<DedupModule<JITModule>> {
    let mut m =
        DedupModule::<JITModule>::with_options(demo::jit_builder().unwrap(), similar_options());
    let workload = demo::build(&mut m, UNITS, STUBS).unwrap();
    m.finalize_definitions().unwrap();
    let merged = m.stats().similar_merged;
    assert!(merged >= 8, "the hashes merge: {}", m.stats());
    let entries = entries(&workload, |id| m.get_finalized_function(id));
    Hashes {
        _module: m,
        entries,
    }
}

/// Calls every entry on every input [`CALLS`] times; returns the time and
/// a checksum of the results.
fn call_all(entries: &[Entry]) -> (Duration, i64) {
    let start = Instant::now();
    let mut sum = 0i64;
    for _ in 0..CALLS {
        for f in entries {
            for (a, b) in INPUTS {
                sum = sum.wrapping_add(f(black_box(a), black_box(b)));
            }
        }
    }
    (start.elapsed(), sum)
}

/// The workload compiled to callable pointers with `options`.
fn compile(options: DedupOptions) -> Duration {
    let start = Instant::now();
    let mut m = DedupModule::<JITModule>::with_options(demo::jit_builder().unwrap(), options);
    demo::build(&mut m, UNITS, STUBS).unwrap();
    m.finalize_definitions().unwrap();
    black_box(&m);
    start.elapsed()
}

fn main() {
    println!("load average before: {}", common::load_average());

    let (plain, merged) = (plain_hashes(), merged_hashes());
    assert_eq!(plain.entries.len(), merged.entries.len());
    assert_eq!(
        call_all(&plain.entries).1,
        call_all(&merged.entries).1,
        "merged code returns what plain code returns"
    );
    let calls = (CALLS * plain.entries.len() * INPUTS.len()) as f64;
    let hashes = [&plain.entries, &merged.entries];
    let calls_spread = common::alternate(2, ROUNDS, 0, |side| call_all(hashes[side]).0);
    let (p, m) = (calls_spread.best[0], calls_spread.best[1]);
    let per_second = |d: Duration| calls / d.as_secs_f64() / 1e6;
    println!(
        "calls of {} hash<T> (thunks when merged), best of {ROUNDS}: plain {:.1} M calls/s, merged {:.1} M calls/s, merged/plain time {:.3} (median of rounds {:.3})",
        plain.entries.len(),
        per_second(p),
        per_second(m),
        calls_spread.best_ratio[1],
        calls_spread.median_ratio[1]
    );

    let ways = [DedupOptions::batch(), similar_options()];
    let compile_spread = common::alternate(2, ROUNDS, 0, |side| compile(ways[side]));
    let (without, with) = (compile_spread.best[0], compile_spread.best[1]);
    println!(
        "compile the workload ({UNITS} units, {STUBS} stubs), batch mode, best of {ROUNDS}: without similar merging {:.2} ms, with {:.2} ms, with/without time {:.3} (median of rounds {:.3})",
        without.as_secs_f64() * 1e3,
        with.as_secs_f64() * 1e3,
        compile_spread.best_ratio[1],
        compile_spread.median_ratio[1]
    );
    println!("load average after: {}", common::load_average());
}
