//! What a JIT author gets from jitfold, against the alternatives, in one
//! run: compiling everything (plain `JITModule`), a map keyed by the printed
//! CLIF (`func.display()`), and Cranelift's incremental cache
//! (`compute_cache_key`, `Context::compile_with_cache` with a
//! `CacheKvStore`). Prints markdown tables:
//!
//! 1. per function, hot and cold: fingerprint and lookup against text
//!    hashing and lookup, and against `compute_cache_key` and lookup,
//!    beside the read-only floor (`per_function.rs`);
//! 2. end to end, `ir::Function` to callable pointer in a finalized
//!    `JITModule`, every way and every jitfold mode, on synthetic workloads
//!    with 0%, 50% and 90% duplicates and on each shared wasm corpus
//!    (`e2e.rs`);
//! 3. functions merged and code bytes per approach, per workload
//!    (`e2e.rs`);
//! 4. warm starts from each persistent cache: Cranelift's on a directory,
//!    jitfold's on a directory and (with the `redis` feature and
//!    `redis-server` installed) on a Redis server on loopback (`e2e.rs`);
//! 5. lookup latency with 10³, 10⁵ and 10⁶ entries, and memory per entry
//!    counted by this file's global allocator (`lookup.rs`);
//! 6. N runtimes starting one program at once, on one `SharedStore`
//!    against N plain modules (`runtimes.rs`).
//!
//! Tables 2 to 4 time each function from the moment a runtime would hand
//! it over: copied from the workload just before it is defined, the clock
//! stopped meanwhile, so that it is in the CPU's caches as a function a
//! runtime just built is (`e2e::Funcs`; `JITFOLD_BENCH_COPY=ahead` copies
//! every function before the clock starts instead, so that each is first
//! read by the run, from memory). Table 6 times a whole program's start,
//! its copy included, for every side.
//!
//! Every comparison runs all its sides in the same process, in rotating
//! order, round after round; each reports the best time of every side and
//! the median over rounds of its time relative to the baseline measured
//! in the same round (`common::alternate`). No thresholds: it only prints.
//!
//! `cargo bench --features tools,redis --bench compare` is the short
//! version (prefixes of the corpora, few rounds); with
//! `JITFOLD_COMPARE=full` it runs whole corpora and more rounds, for the
//! README. `JITFOLD_COMPARE=runtimes` runs table 6 alone, on whole
//! corpora; `JITFOLD_COMPARE=warm` table 4 alone, on whole corpora
//! (`JITFOLD_WARM_ROUNDS` rounds, 11 by default; with
//! `JITFOLD_WARM_PROFILE=SIDE:RUNS`, one of its warm sides alone, on the
//! first corpus with the verifier off (on with
//! `JITFOLD_WARM_PROFILE_VERIFIER=on`), `RUNS` times after the stores are
//! filled, for a profiler: see `e2e::profiled_side`; under `perf record`,
//! start the bench through `env -u PERF_BUILDID_DIR`: with that variable
//! set, as perf sets it for what it runs, cranelift-jit opens and appends
//! to `/tmp/perf-PID.map` for every function it defines, a quarter of a
//! warm start's time).
//! `JITFOLD_BENCH_CORPORA` names a folder holding the corpora
//! unpacked (one folder each), for a machine without `../shared`.

#[allow(dead_code)]
mod common;
#[path = "compare/e2e.rs"]
mod e2e;
#[path = "compare/lookup.rs"]
mod lookup;
#[path = "compare/per_function.rs"]
mod per_function;
#[path = "compare/runtimes.rs"]
mod runtimes;

pub use common::{Spread, alternate, median};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, counting live bytes while [`COUNTING`] is set (so
/// that timed sections pay one relaxed load per allocation, no more).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the same arguments; the
// counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes `build` leaves allocated (allocated minus freed while it
/// runs), with what it returns. Only this thread should allocate meanwhile.
pub fn live_bytes_of<T>(build: impl FnOnce() -> T) -> (isize, T) {
    LIVE.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::SeqCst);
    let value = build();
    COUNTING.store(false, Ordering::SeqCst);
    (LIVE.load(Ordering::Relaxed), value)
}

/// How much to run: the short version, or the full one for the README.
pub struct Config {
    /// `JITFOLD_COMPARE=full`.
    pub full: bool,
    /// Rounds of the per-function comparison.
    pub per_function_rounds: usize,
    /// Functions of each synthetic end-to-end workload.
    pub synthetic_functions: usize,
    /// Rounds on each synthetic workload.
    pub synthetic_rounds: usize,
    /// Functions taken from each wasm corpus (in file order; all if
    /// `None`).
    pub corpus_limit: Option<usize>,
    /// Rounds on each corpus, end to end and warm.
    pub corpus_rounds: usize,
    /// Lookups timed one by one per cache size.
    pub probes: usize,
    /// `JITFOLD_COMPARE=runtimes`: table 6 alone.
    pub runtimes_only: bool,
    /// `JITFOLD_COMPARE=warm`: table 4 alone.
    pub warm_only: bool,
}

impl Config {
    fn from_env() -> Config {
        let full = std::env::var("JITFOLD_COMPARE").is_ok_and(|v| v == "full");
        let runtimes_only = std::env::var("JITFOLD_COMPARE").is_ok_and(|v| v == "runtimes");
        let warm_only = std::env::var("JITFOLD_COMPARE").is_ok_and(|v| v == "warm");
        if warm_only {
            return Config {
                corpus_limit: None,
                corpus_rounds: std::env::var("JITFOLD_WARM_ROUNDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(11),
                warm_only,
                ..Config::short()
            };
        }
        if runtimes_only {
            return Config {
                corpus_limit: None,
                runtimes_only,
                ..Config::short()
            };
        }
        if full {
            Config {
                full,
                per_function_rounds: 11,
                synthetic_functions: 300,
                synthetic_rounds: 101,
                corpus_limit: None,
                corpus_rounds: 11,
                probes: 100_000,
                runtimes_only,
                warm_only,
            }
        } else {
            Config::short()
        }
    }

    /// The short run's settings.
    fn short() -> Config {
        Config {
            full: false,
            per_function_rounds: 5,
            synthetic_functions: 300,
            synthetic_rounds: 21,
            corpus_limit: Some(300),
            corpus_rounds: 5,
            probes: 20_000,
            runtimes_only: false,
            warm_only: false,
        }
    }
}

/// The host ISA with `jitfold::isa::jit_flags()`'s settings and the
/// verifier on or off (embedders such as wasmtime ship with it off).
pub fn isa_with_verifier(verifier: bool) -> cranelift_codegen::isa::OwnedTargetIsa {
    let flags = jitfold::isa::flags(&[
        ("opt_level", "speed"),
        ("preserve_frame_pointers", "true"),
        ("enable_verifier", if verifier { "true" } else { "false" }),
    ])
    .expect("settings exist");
    jitfold::isa::host_isa(flags).expect("host ISA")
}

/// Prints a markdown table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    println!("| {} |", headers.join(" | "));
    println!("|{}", "---|".repeat(headers.len()));
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
    println!();
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// The machine, the toolchain and the command, as a table.
fn print_machine(config: &Config) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The compiler that built this bench (`build.rs`): a machine that
    // runs a carried binary may have none.
    let rustc = env!("JITFOLD_RUSTC_VERSION");
    let command = if config.full {
        "JITFOLD_COMPARE=full cargo bench --features tools,redis --bench compare"
    } else if config.warm_only {
        "JITFOLD_COMPARE=warm cargo bench --features tools,redis --bench compare"
    } else if config.runtimes_only {
        "JITFOLD_COMPARE=runtimes cargo bench --features tools,redis --bench compare"
    } else {
        "cargo bench --features tools,redis --bench compare"
    };
    println!("## jitfold against the alternatives\n");
    table(
        &["", ""],
        &[
            vec!["CPU".into(), cpu],
            vec!["cores".into(), cores.to_string()],
            vec!["rustc".into(), rustc.into()],
            vec!["Cranelift".into(), "0.135.8".into()],
            vec!["command".into(), format!("`{command}`")],
            vec![
                "load average at start (1, 5, 15 min)".into(),
                common::load_average(),
            ],
            vec!["stores made in".into(), common::store_file_system()],
        ],
    );
}

fn main() {
    let config = Config::from_env();
    // A runtime of table 6's processes rows, started by this bench.
    if runtimes::run_as_child(&config) {
        return;
    }
    let start = Instant::now();
    print_machine(&config);
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).expect("host ISA");
    let corpora = e2e::Corpus::load_all(&*isa, &config);
    if config.warm_only {
        e2e::print_warm(&corpora, &config);
    } else if !config.runtimes_only {
        per_function::print(&corpora, &*isa, &config);
        e2e::print(&corpora, &isa, &config);
        lookup::print(&config);
    }
    if !config.warm_only {
        runtimes::print(&corpora, &config);
    }
    println!(
        "Load average at the end: {}; the whole run took {:.0} s.",
        common::load_average(),
        start.elapsed().as_secs_f64()
    );
}
