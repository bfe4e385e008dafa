//! End to end, `ir::Function` to callable pointer: every way declares the
//! workload's functions in a fresh `JITModule` before the clock starts,
//! then, timed, defines every function, finalizes, and gets every
//! function's pointer. The ways:
//!
//! - plain: `JITModule::define_function` for each;
//! - text map: the function printed without its name (`func.display()`)
//!   as the key of a `HashMap`; a function whose text was seen is defined
//!   from a copy of the first one's code and relocations
//!   (`define_function_bytes`: same text, same code, same callees), the
//!   others compiled;
//! - Cranelift's cache: `Context::compile_with_cache` with an in-memory
//!   `CacheKvStore` that starts empty, the code then defined with
//!   `define_function_bytes`;
//! - jitfold, `DedupModule<JITModule>` in each mode: eager without reuse
//!   (exact duplicates only), eager (the default: exact and reuse), batch
//!   (call-graph refinement and reuse, one thread), and batch on two
//!   threads (`DedupOptions::with_threads(2)`), and batch with
//!   similar-function merging (`DedupOptions::with_similar`, default
//!   limits and cost model: functions that differ in constants become
//!   thunks calling one body).
//!
//! Every function keeps an address of its own in every way. The wasm
//! corpora's functions call functions outside the corpus: those callees
//! are declared and defined as stubs (a trap) before the clock starts, and
//! names outside the module resolve to a dummy address (nothing is
//! called). Warm starts: the same with each persistent cache filled by an
//! earlier run, read through a fresh store, as a new process would.

use crate::e2e::Way::*;
use crate::per_function::text_of;
use crate::{Config, Spread, alternate, median, ms, table};
use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::incremental_cache::CacheKvStore;
use cranelift_codegen::ir::{
    ExternalName, Function, GlobalValueData, InstBuilder, Signature, TrapCode, UserFuncName,
};
use cranelift_codegen::isa::{OwnedTargetIsa, TargetIsa};
use cranelift_codegen::packed_option::ReservedValue;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{ArenaMemoryProvider, JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleReloc, default_libcall_names};
use jitfold::compile::{compile, with_quiet_panics};
use jitfold::similar::SimilarOptions;
use jitfold::store::{CodeStore, DirectoryStore, PackStore};
use jitfold::{DedupModule, DedupOptions, Stats};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One shared corpus: all its valid functions, and whether it is a wasm
/// module (the filetests are not: they are measured per function only).
pub struct Corpus {
    pub name: String,
    pub all: Vec<Function>,
    pub wasm: bool,
}

impl Corpus {
    pub fn load_all(isa: &dyn TargetIsa, _config: &Config) -> Vec<Corpus> {
        crate::common::corpus_dirs()
            .into_iter()
            .map(|dir| Corpus::load(&dir, isa))
            .collect()
    }

    /// The corpus in `dir`.
    pub fn load(dir: &std::path::Path, isa: &dyn TargetIsa) -> Corpus {
        Corpus {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            all: jitfold::corpus::valid_functions(&[dir.to_path_buf()], Some(isa))
                .expect("corpus loads"),
            wasm: !dir.to_string_lossy().contains("filetests"),
        }
    }
}

/// A workload ready to define: function `i` is named `u0:i` and defined as
/// module id `i`; the callees it names that the workload does not define
/// are ids `funcs.len()..`, with these signatures.
pub struct Workload {
    pub name: String,
    pub funcs: Vec<Function>,
    stubs: Vec<Signature>,
    /// Whether it is a shared corpus (warm starts are measured on those).
    corpus: bool,
}

impl Workload {
    /// Functions with no calls (the synthetic workloads).
    pub fn plain(name: String, mut funcs: Vec<Function>) -> Self {
        for (i, f) in funcs.iter_mut().enumerate() {
            f.name = UserFuncName::user(0, i as u32);
        }
        Workload {
            name,
            funcs,
            stubs: Vec::new(),
            corpus: false,
        }
    }

    /// The first `limit` functions of a corpus that compile, their
    /// callees bound to the ids of the workload's functions or of stubs.
    pub fn of_corpus(corpus: &Corpus, isa: &dyn TargetIsa, limit: Option<usize>) -> Self {
        let funcs: Vec<Function> = with_quiet_panics(|| {
            corpus
                .all
                .iter()
                .filter(|f| compile(f, isa).is_ok())
                .take(limit.unwrap_or(usize::MAX))
                .cloned()
                .collect()
        });
        let mut ids: HashMap<UserFuncName, FuncId> = HashMap::new();
        let mut kept = Vec::new();
        for f in funcs {
            if !ids.contains_key(&f.name) {
                ids.insert(f.name.clone(), FuncId::from_u32(kept.len() as u32));
                kept.push(f);
            }
        }
        let mut stubs = Vec::new();
        for f in &kept {
            for (name, sig) in named_callees(f) {
                ids.entry(name).or_insert_with(|| {
                    stubs.push(sig);
                    FuncId::from_u32((kept.len() + stubs.len() - 1) as u32)
                });
            }
        }
        for (i, f) in kept.iter_mut().enumerate() {
            jitfold::corpus::bind_names(f, FuncId::from_u32(i as u32), &ids)
                .expect("every name is bound");
        }
        Workload {
            name: corpus.name.clone(),
            funcs: kept,
            stubs,
            corpus: true,
        }
    }
}

/// The functions `f` names (calls or takes the address of) by user or
/// test-case name, with the signature it gives them (none for symbols).
fn named_callees(f: &Function) -> Vec<(UserFuncName, Signature)> {
    let as_func_name = |name: &ExternalName| match name {
        ExternalName::TestCase(t) if !t.raw().is_empty() => Some(UserFuncName::Testcase(t.clone())),
        ExternalName::User(r) => Some(UserFuncName::User(f.params.user_named_funcs()[*r].clone())),
        _ => None,
    };
    let mut out = Vec::new();
    for data in f.dfg.ext_funcs.values() {
        if let Some(name) = as_func_name(&data.name)
            && !data.signature.is_reserved_value()
        {
            out.push((name, f.dfg.signatures[data.signature].clone()));
        }
    }
    for data in f.global_values.values() {
        if let GlobalValueData::Symbol { name, .. } = data
            && let Some(name) = as_func_name(name)
        {
            out.push((name, Signature::new(f.signature.call_conv)));
        }
    }
    out
}

/// The ways, in table order; plain is the baseline.
#[derive(Clone, Copy)]
pub enum Way {
    Plain,
    TextMap,
    CraneliftCache,
    Jitfold(DedupOptions, &'static str),
}

pub const WAYS: [Way; 8] = [
    Plain,
    TextMap,
    CraneliftCache,
    Jitfold(
        DedupOptions::eager().with_reuse(false),
        "jitfold eager, exact only",
    ),
    Jitfold(DedupOptions::eager(), "jitfold eager (exact + reuse)"),
    Jitfold(DedupOptions::batch(), "jitfold batch (+ calls refined)"),
    Jitfold(
        DedupOptions::batch().with_threads(2),
        "jitfold batch, 2 threads",
    ),
    Jitfold(
        DedupOptions::batch().with_similar(SimilarOptions::DEFAULT),
        "jitfold batch + similar",
    ),
];

impl Way {
    pub fn name(self) -> &'static str {
        match self {
            Plain => "plain `JITModule`",
            TextMap => "text map",
            CraneliftCache => "Cranelift's cache (in memory)",
            Jitfold(_, name) => name,
        }
    }
}

/// What one run did.
#[derive(Default)]
pub struct Run {
    pub time: Duration,
    /// Functions defined without being compiled.
    pub merged: u64,
    /// Machine-code bytes defined (trampolines included).
    pub code_bytes: u64,
    pub stats: Option<Stats>,
}

/// A persistent cache a run reads and fills.
pub enum Persistent<'a> {
    None,
    Cranelift(&'a mut dyn CacheKvStore),
    Jitfold(Arc<dyn CodeStore>),
}

/// Where a run's functions come from. Either way, copying them is the
/// bench's work, not the runtime's, and is not timed.
pub enum Funcs<'a> {
    /// Copied by the caller beforehand, all of them: each function is
    /// first read by the run, from memory (a whole corpus is more than
    /// the CPU's caches hold).
    Copied(Vec<Function>),
    /// Each copied from these just before it is defined, the clock
    /// stopped meanwhile: the function is in the CPU's caches, as a
    /// function a runtime just built is.
    JustBuilt(&'a [Function]),
}

impl Funcs<'_> {
    /// The functions in order, and a count of the time spent copying them
    /// (to take off the run's).
    fn each(self) -> (impl Iterator<Item = Function>, CopyTime) {
        let copying = CopyTime::default();
        let counted = copying.clone();
        let (copied, built) = match self {
            Funcs::Copied(funcs) => (funcs, &[][..]),
            Funcs::JustBuilt(funcs) => (Vec::new(), funcs),
        };
        let built = built.iter().map(move |f| {
            let start = Instant::now();
            let f = f.clone();
            counted.0.set(counted.0.get() + start.elapsed());
            f
        });
        (copied.into_iter().chain(built), copying)
    }
}

/// Time spent copying functions inside a timed run (see [`Funcs::each`]).
#[derive(Clone, Default)]
struct CopyTime(std::rc::Rc<std::cell::Cell<Duration>>);

impl CopyTime {
    fn get(&self) -> Duration {
        self.0.get()
    }
}

/// Runs `way` on `w` in a fresh module, each function copied from `w`
/// just before it is defined (see [`Funcs::JustBuilt`]), or, with
/// `JITFOLD_BENCH_COPY=ahead`, all of them before the run starts
/// ([`Funcs::Copied`]).
pub fn run(way: Way, w: &Workload, isa: &OwnedTargetIsa, cache: Persistent<'_>) -> Run {
    let funcs = if std::env::var("JITFOLD_BENCH_COPY").is_ok_and(|v| v == "ahead") {
        Funcs::Copied(w.funcs.clone())
    } else {
        Funcs::JustBuilt(&w.funcs)
    };
    run_with(way, w, funcs, isa, cache)
}

/// [`run`], defining `funcs`.
pub fn run_with(
    way: Way,
    w: &Workload,
    funcs: Funcs<'_>,
    isa: &OwnedTargetIsa,
    cache: Persistent<'_>,
) -> Run {
    let mut builder = JITBuilder::with_isa(isa.clone(), default_libcall_names());
    builder.symbol_lookup_fn(Box::new(|_| Some(unresolved as *const u8)));
    // One reserved region per module: with the system allocator, 16
    // runtimes at once (table 6) got one module's code more than 2 GiB
    // from code it calls, and cranelift-jit panics on such a call's
    // relocation (plain modules as well as wrapped ones).
    builder.memory_provider(Box::new(
        ArenaMemoryProvider::new_with_size(1 << 30).expect("1 GiB of address space"),
    ));
    match way {
        Jitfold(options, _) => {
            // (`with_options`, not `wrap`: a module it makes is known to
            // write no frame descriptions, so it may load entries stored
            // without unwind information.)
            let mut m = DedupModule::with_options(builder, options);
            if let Persistent::Jitfold(store) = cache {
                m = m.with_store(store, None);
            }
            declare(&mut m, w, isa);
            let (funcs, copying) = funcs.each();
            let start = Instant::now();
            let mut ctx = Context::new();
            for (i, f) in funcs.enumerate() {
                ctx.clear();
                ctx.func = f;
                m.define_function(FuncId::from_u32(i as u32), &mut ctx)
                    .unwrap();
            }
            m.finalize_definitions().unwrap();
            for i in 0..w.funcs.len() {
                black_box(m.get_finalized_function(FuncId::from_u32(i as u32)));
            }
            let time = start.elapsed() - copying.get();
            let stats = m.stats().clone();
            // SAFETY: no pointer into this module's code is used after.
            unsafe { m.into_inner().free_memory() };
            Run {
                time,
                merged: stats.reused
                    + stats.loaded
                    + stats.adapted
                    + stats.aliased
                    + stats.trampolined,
                code_bytes: stats.code_bytes + stats.trampoline_bytes,
                stats: Some(stats),
            }
        }
        _ => {
            let mut m = JITModule::new(builder);
            declare(&mut m, w, isa);
            let mut memory = MemoryKv::default();
            let store: &mut dyn CacheKvStore = match cache {
                Persistent::Cranelift(store) => store,
                _ => &mut memory,
            };
            let (funcs, copying) = funcs.each();
            let start = Instant::now();
            let (merged, code_bytes) = define_all(way, &mut m, funcs, isa, store);
            m.finalize_definitions().unwrap();
            for i in 0..w.funcs.len() {
                black_box(m.get_finalized_function(FuncId::from_u32(i as u32)));
            }
            let time = start.elapsed() - copying.get();
            // SAFETY: no pointer into this module's code is used after.
            unsafe { m.free_memory() };
            Run {
                time,
                merged,
                code_bytes,
                stats: None,
            }
        }
    }
}

/// What names outside the module resolve to; never called.
extern "C" fn unresolved() {}

/// Declares the workload's functions and stubs, and defines the stubs.
fn declare<M: Module>(m: &mut M, w: &Workload, isa: &OwnedTargetIsa) {
    for (i, f) in w.funcs.iter().enumerate() {
        m.declare_function(&format!("f{i}"), Linkage::Local, &f.signature)
            .unwrap();
    }
    let stub = stub_code(&**isa);
    for (i, sig) in w.stubs.iter().enumerate() {
        let id = m
            .declare_function(&format!("stub{i}"), Linkage::Local, sig)
            .unwrap();
        m.define_function_bytes(id, 16, &stub, &[]).unwrap();
    }
}

/// A function that traps, compiled.
fn stub_code(isa: &dyn TargetIsa) -> Vec<u8> {
    let mut func = Function::new();
    func.signature = Signature::new(isa.default_call_conv());
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut fctx);
    let block = b.create_block();
    b.switch_to_block(block);
    b.ins().trap(TrapCode::unwrap_user(1));
    b.seal_all_blocks();
    b.finalize(isa.frontend_config());
    let mut ctx = Context::for_function(func);
    ctx.compile(isa, &mut ControlPlane::default())
        .unwrap()
        .code_buffer()
        .to_vec()
}

/// Defines every function of a plain module the way `way` does (plain,
/// text map or Cranelift's cache): functions not compiled, code bytes.
fn define_all(
    way: Way,
    m: &mut JITModule,
    funcs: impl Iterator<Item = Function>,
    isa: &OwnedTargetIsa,
    store: &mut dyn CacheKvStore,
) -> (u64, u64) {
    let (mut merged, mut bytes) = (0, 0);
    let mut texts: HashMap<String, (u64, Vec<u8>, Vec<ModuleReloc>)> = HashMap::new();
    let mut ctx = Context::new();
    for (i, mut f) in funcs.enumerate() {
        let id = FuncId::from_u32(i as u32);
        let text = matches!(way, TextMap).then(|| text_of(&mut f));
        if let Some((align, code, relocs)) = text.as_ref().and_then(|t| texts.get(t)) {
            m.define_function_bytes(id, *align, code, relocs).unwrap();
            merged += 1;
            bytes += code.len() as u64;
            continue;
        }
        ctx.clear();
        ctx.func = f;
        if matches!(way, CraneliftCache) {
            let hit = ctx
                .compile_with_cache(&**isa, store, &mut ControlPlane::default())
                .map(|(_, hit)| hit)
                .map_err(|e| format!("{:?}", e.inner))
                .unwrap();
            merged += u64::from(hit);
            let code = ctx.compiled_code().unwrap();
            let relocs = relocs_of(&ctx, id);
            m.define_function_bytes(
                id,
                code.buffer.alignment as u64,
                code.code_buffer(),
                &relocs,
            )
            .unwrap();
            bytes += code.code_buffer().len() as u64;
            continue;
        }
        m.define_function(id, &mut ctx).unwrap();
        let code = ctx.compiled_code().unwrap();
        bytes += code.code_buffer().len() as u64;
        if let Some(text) = text {
            let entry = (
                code.buffer.alignment as u64,
                code.code_buffer().to_vec(),
                relocs_of(&ctx, id),
            );
            texts.insert(text, entry);
        }
    }
    (merged, bytes)
}

fn relocs_of(ctx: &Context, id: FuncId) -> Vec<ModuleReloc> {
    let code = ctx.compiled_code().unwrap();
    code.buffer
        .relocs()
        .iter()
        .map(|r| ModuleReloc::from_mach_reloc(r, &ctx.func, id))
        .collect()
}

/// Cranelift's cache store, in memory.
#[derive(Default)]
pub struct MemoryKv(HashMap<Vec<u8>, Vec<u8>>);

impl CacheKvStore for MemoryKv {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        self.0.get(key).map(|v| Cow::Borrowed(&v[..]))
    }

    fn insert(&mut self, key: &[u8], val: Vec<u8>) {
        self.0.insert(key.to_vec(), val);
    }
}

/// Every way on `w`, alternating; also what each did in its first run.
fn compare(w: &Workload, isa: &OwnedTargetIsa, rounds: usize) -> (Spread, Vec<Run>) {
    let mut first: Vec<Option<Run>> = WAYS.iter().map(|_| None).collect();
    let spread = alternate(WAYS.len(), rounds, 0, |side| {
        let r = run(WAYS[side], w, isa, Persistent::None);
        let time = r.time;
        first[side].get_or_insert(r);
        time
    });
    (spread, first.into_iter().map(Option::unwrap).collect())
}

/// Prints the end-to-end, warm-start and merge tables.
pub fn print(corpora: &[Corpus], isa: &OwnedTargetIsa, config: &Config) {
    let conv = isa.default_call_conv();
    let n = config.synthetic_functions;
    let mut workloads: Vec<(Workload, usize)> = [(0, false), (50, false), (90, false), (90, true)]
        .into_iter()
        .map(|(p, renumbered)| {
            let name = format!(
                "{p}% duplicates{}",
                if renumbered { ", renumbered" } else { "" }
            );
            let funcs = crate::common::workload(n, p, renumbered, conv);
            (Workload::plain(name, funcs), config.synthetic_rounds)
        })
        .collect();
    for c in corpora.iter().filter(|c| c.wasm) {
        let w = Workload::of_corpus(c, &**isa, config.corpus_limit);
        workloads.push((w, config.corpus_rounds));
    }
    let mut results = Vec::new();
    for (w, rounds) in &workloads {
        eprintln!("end to end: {} ({rounds} rounds)", w.name);
        let (spread, runs) = compare(w, isa, *rounds);
        let counts = run(
            Jitfold(DedupOptions::batch().with_reuse(false), ""),
            w,
            isa,
            Persistent::None,
        );
        results.push((w, *rounds, spread, runs, counts));
    }
    println!(
        "### 2. End to end: `ir::Function` to callable pointer (`JITModule`, finalized)\n\n\
         Timed: define every function, finalize, get every pointer (declaring is before the \
         clock). Synthetic workloads: {n} functions of about 40 instructions, duplicates \
         built the same way as their original (`renumbered`: with other value numbers). \
         Corpora: {} functions of each wasm module that compile, in file order. Each cell: \
         best time in ms; time relative to plain, best against best (median of the ratios \
         within each round), over the rounds given. Every function keeps its own address.\n",
        config
            .corpus_limit
            .map_or("all".to_string(), |l| format!("the first {l}"))
    );
    let mut headers = vec!["workload", "functions", "rounds"];
    headers.extend(WAYS.iter().map(|w| w.name()));
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(w, rounds, s, _, _)| {
            let mut row = vec![
                w.name.clone(),
                w.funcs.len().to_string(),
                rounds.to_string(),
            ];
            row.push(ms(s.best[0]));
            row.extend((1..WAYS.len()).map(|i| format!("{}; {}", ms(s.best[i]), s.ratio(i))));
            row
        })
        .collect();
    table(&headers, &rows);

    println!(
        "### 3. Functions merged (defined without compiling) and code bytes, per approach\n\n\
         From each way's first run above. Text map: functions whose name-less text was seen \
         before. Cranelift's cache: hits. jitfold exact: duplicates by fingerprint; + calls: \
         batch mode without reuse (exact, then refined over the call graph); + reuse: eager, \
         code copied from a function with the same template; batch: all three; + similar: \
         also functions that differ in constants, made thunks of one body (thunks are \
         compiled, so not counted as merged; their count is given). Code bytes include \
         copies, trampolines, thunks and bodies.\n"
    );
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(w, _, _, runs, calls)| {
            let cell = |r: &Run| format!("{}; {} B", r.merged, r.code_bytes);
            vec![
                w.name.clone(),
                w.funcs.len().to_string(),
                format!("{} B", runs[0].code_bytes),
                cell(&runs[1]),
                cell(&runs[2]),
                cell(&runs[3]),
                cell(calls),
                cell(&runs[4]),
                cell(&runs[5]),
                runs[7].stats.as_ref().map_or(String::new(), |st| {
                    format!(
                        "{}; {} B; {} into thunks of {} bodies",
                        runs[7].merged, runs[7].code_bytes, st.similar_merged, st.similar_groups
                    )
                }),
            ]
        })
        .collect();
    table(
        &[
            "workload",
            "functions",
            "plain: code",
            "text map: merged; code",
            "Cranelift's cache",
            "jitfold exact",
            "jitfold exact + calls",
            "jitfold exact + reuse",
            "jitfold batch: exact + calls + reuse",
            "jitfold batch + similar",
        ],
        &rows,
    );

    warm(&workloads, config);
}

/// Table 4 alone (`JITFOLD_COMPARE=warm`), on the wasm corpora.
pub fn print_warm(corpora: &[Corpus], config: &Config) {
    let isa = crate::isa_with_verifier(true);
    let workloads: Vec<(Workload, usize)> = corpora
        .iter()
        .filter(|c| c.wasm)
        .map(|c| {
            (
                Workload::of_corpus(c, &*isa, config.corpus_limit),
                config.corpus_rounds,
            )
        })
        .collect();
    warm(&workloads, config);
}

/// `JITFOLD_WARM_PROFILE=SIDE:RUNS`, read: the warm side (1 Cranelift's
/// cache, 2 and 3 jitfold eager and batch on a directory, 4 and 5 on a
/// pack, 6 batch on two threads on a pack, 7 batch on Redis) to run
/// `RUNS` times alone, for a profiler.
fn profiled_side() -> Option<(usize, usize)> {
    let text = std::env::var("JITFOLD_WARM_PROFILE").ok()?;
    let parsed = text
        .split_once(':')
        .and_then(|(side, runs)| Some((side.parse().ok()?, runs.parse().ok()?)))
        .filter(|&(side, runs)| (1..=7).contains(&side) && runs > 0);
    assert!(
        parsed.is_some(),
        "JITFOLD_WARM_PROFILE={text}: SIDE:RUNS, SIDE from 1 to 7, RUNS at least 1"
    );
    parsed
}

/// Whether a profiled side runs with the verifier on
/// (`JITFOLD_WARM_PROFILE_VERIFIER=on`; off otherwise).
fn profile_verifier() -> bool {
    std::env::var("JITFOLD_WARM_PROFILE_VERIFIER").is_ok_and(|v| v == "on")
}

/// Runs warm side `side` `runs` times and prints the mean and the median
/// of its times (the median is the steadier on a noisy machine); the
/// caller then ends the process: the profile holds the store's filling,
/// then these runs alone.
fn profile_side(side: usize, runs: usize, warm_side: impl Fn(usize) -> Run) {
    let times: Vec<Duration> = (0..runs).map(|_| warm_side(side).time).collect();
    let total: Duration = times.iter().sum();
    let setting = if profile_verifier() { "on" } else { "off" };
    eprintln!(
        "warm side {side}, verifier {setting}: {:.2} ms a run, mean of {runs}; median {:.2} ms",
        total.as_secs_f64() * 1e3 / runs as f64,
        median(times).as_secs_f64() * 1e3
    );
}

/// Where the sides of table 4 keep their code: Cranelift's cache in a
/// directory, and jitfold's in a store made afresh for each run, as by a
/// new process (a directory store, a pack, a Redis server if any).
struct Stores<'a> {
    cranelift: &'a std::path::Path,
    dir: &'a dyn Fn() -> Arc<dyn CodeStore>,
    pack: &'a dyn Fn() -> Arc<dyn CodeStore>,
    fleet: &'a dyn Fn() -> Option<Arc<dyn CodeStore>>,
}

/// Runs side `side` of table 4 on `w` with `stores`: 0 plain, 1
/// Cranelift's cache, 2 and 3 jitfold eager and batch on the directory
/// store, 4 and 5 on the pack, 6 batch on two threads on the pack, 7
/// batch on Redis.
fn run_side(side: usize, w: &Workload, isa: &OwnedTargetIsa, stores: &Stores<'_>) -> Run {
    let (eager, batch) = (
        Jitfold(DedupOptions::eager(), ""),
        Jitfold(DedupOptions::batch(), ""),
    );
    let cranelift = || crate::common::DirKv(stores.cranelift.to_path_buf());
    match side {
        0 => run(Plain, w, isa, Persistent::None),
        1 => run(
            CraneliftCache,
            w,
            isa,
            Persistent::Cranelift(&mut cranelift()),
        ),
        2 => run(eager, w, isa, Persistent::Jitfold((stores.dir)())),
        3 => run(batch, w, isa, Persistent::Jitfold((stores.dir)())),
        4 => run(eager, w, isa, Persistent::Jitfold((stores.pack)())),
        5 => run(batch, w, isa, Persistent::Jitfold((stores.pack)())),
        6 => run(
            Jitfold(DedupOptions::batch().with_threads(2), ""),
            w,
            isa,
            Persistent::Jitfold((stores.pack)()),
        ),
        _ => {
            let store = (stores.fleet)().expect("a fleet side only with a server");
            run(batch, w, isa, Persistent::Jitfold(store))
        }
    }
}

/// A fresh, empty directory for this bench.
fn scratch(name: &str) -> PathBuf {
    crate::common::scratch("compare", name)
}

/// Warm starts on the corpora, with Cranelift's verifier on and off: each
/// persistent cache filled by one run, then read by fresh stores in
/// alternating rounds against plain: Cranelift's cache on a directory,
/// jitfold eager and batch on a `DirectoryStore` and on a `PackStore`, and
/// jitfold batch on a Redis server on loopback (with the `redis` feature
/// and `redis-server` installed).
fn warm(workloads: &[(Workload, usize)], config: &Config) {
    let fleet = fleet::Server::start();
    let mut rows = Vec::new();
    let profile = profiled_side();
    // Every store directory of the table, deleted at its end, not between
    // runs: a directory deleted just before a run would have that run's
    // store writer meet the file system skipping over the thousands of
    // inodes just freed (ext4 without a journal does not hand out an inode
    // again in the seconds after its file is deleted, `recently_deleted`
    // in `fs/ext4/ialloc.c`): a cost of the bench's deleting, which a
    // runtime's start does not pay. (A bench that stops early leaves them
    // in the temporary directory, named by its process id.)
    let mut leftovers: Vec<PathBuf> = Vec::new();
    for verifier in [true, false] {
        // A profile runs with the verifier off, as embedders ship, unless
        // `JITFOLD_WARM_PROFILE_VERIFIER=on`.
        if profile.is_some() && verifier != profile_verifier() {
            continue;
        }
        let isa = &crate::isa_with_verifier(verifier);
        for (w, _) in workloads
            .iter()
            .filter(|(w, _)| w.corpus && !w.funcs.is_empty())
        {
            eprintln!("warm: {}, verifier {verifier}", w.name);
            let n = leftovers.len();
            let cl_dir = scratch(&format!("cranelift-{n}"));
            let (dir_dir, pack_dir) = (
                scratch(&format!("jitfold-{n}")),
                scratch(&format!("jitfold-pack-{n}")),
            );
            // A fresh store each run, as a new process of the fleet.
            let dir_store = || -> Arc<dyn CodeStore> {
                Arc::new(
                    DirectoryStore::new(&dir_dir)
                        .unwrap()
                        .with_limit(u64::MAX / 2),
                )
            };
            let pack_store = || -> Arc<dyn CodeStore> {
                Arc::new(PackStore::new(&pack_dir).unwrap().with_limit(u64::MAX / 2))
            };
            let fleet_store = || fleet.as_ref().map(|server| server.store(&w.name));
            // Cold: each side filling an empty directory, alternating
            // with plain round after round. Each run gets a directory of
            // its own, kept to the end of the table (see `leftovers`).
            let cold = alternate(6, config.corpus_rounds, 0, |side| {
                let cold_dir = scratch(&format!("cold-{}", leftovers.len()));
                let cold_store =
                    || -> Arc<dyn CodeStore> { Arc::new(DirectoryStore::new(&cold_dir).unwrap()) };
                let cold_pack =
                    || -> Arc<dyn CodeStore> { Arc::new(PackStore::new(&cold_dir).unwrap()) };
                let cold_stores = Stores {
                    cranelift: &cold_dir,
                    dir: &cold_store,
                    pack: &cold_pack,
                    fleet: &|| None,
                };
                let time = run_side(side, w, isa, &cold_stores).time;
                leftovers.push(cold_dir);
                time
            });
            // The stores the warm runs read, filled: Cranelift's, the
            // directory, the pack and Redis.
            let stores = Stores {
                cranelift: &cl_dir,
                dir: &dir_store,
                pack: &pack_store,
                fleet: &fleet_store,
            };
            // Sides: plain, Cranelift, eager and batch on each embedded
            // store, batch on two threads on the pack, batch on Redis.
            let sides = if fleet.is_some() { 8 } else { 7 };
            for side in [1, 2, 4, 7].into_iter().filter(|&side| side < sides) {
                run_side(side, w, isa, &stores);
            }
            let warm_side = |side: usize| run_side(side, w, isa, &stores);
            if let Some((side, runs)) = profile {
                profile_side(side, runs, warm_side);
                // The process ends here: its stores and its Redis server
                // with it.
                for dir in leftovers.iter().chain([&cl_dir, &dir_dir, &pack_dir]) {
                    let _ = std::fs::remove_dir_all(dir);
                }
                drop(fleet);
                std::process::exit(0);
            }
            let mut hits = [0u64; 8];
            let spread = alternate(sides, config.corpus_rounds, 0, |side| {
                let r = warm_side(side);
                hits[side] = r.stats.as_ref().map_or(r.merged, |s| s.loaded);
                r.time
            });
            let per_fn = |dir: &PathBuf| crate::common::size_of_dir(dir) / w.funcs.len() as u64;
            let jitfold = |side: usize| {
                format!(
                    "{}; {}; {} loaded",
                    ms(spread.best[side]),
                    spread.ratio(side),
                    hits[side]
                )
            };
            rows.push(vec![
                w.name.clone(),
                if verifier { "on" } else { "off" }.into(),
                w.funcs.len().to_string(),
                ms(spread.best[0]),
                (1..6)
                    .map(|side| cold.ratio(side))
                    .collect::<Vec<_>>()
                    .join("; "),
                format!(
                    "{}; {}; {} hits; {} B/function",
                    ms(spread.best[1]),
                    spread.ratio(1),
                    hits[1],
                    per_fn(&cl_dir)
                ),
                format!("{}; {} B/function", jitfold(2), per_fn(&dir_dir)),
                jitfold(3),
                format!("{}; {} B/function", jitfold(4), per_fn(&pack_dir)),
                jitfold(5),
                jitfold(6),
                if fleet.is_some() {
                    jitfold(7)
                } else {
                    fleet::MISSING.to_string()
                },
            ]);
            eprintln!("{}", rows.last().expect("pushed").join(" | "));
            leftovers.extend([cl_dir, dir_dir, pack_dir]);
        }
    }
    for dir in leftovers {
        let _ = std::fs::remove_dir_all(dir);
    }
    println!(
        "### 4. Warm start from a persistent cache\n\n\
         Same timing as table 2. Cold: one run filling an empty store. Warm: a fresh store \
         on the filled one each run, as a new process: Cranelift's `compile_with_cache` on a \
         directory-backed `CacheKvStore` (one file per key); jitfold (`DedupModule::with_store`) \
         eager and batch with a `DirectoryStore` (one file per entry) and with a `PackStore` \
         (entries appended to pack files), batch on two threads with the `PackStore`, \
         and batch with a `RedisStore` on a `redis-server` on loopback (a batch flush asks for all its entries at once). \
         Cranelift's verifier on and off (wasmtime ships with it off). Cold: Cranelift's \
         cache, then jitfold eager and batch on a directory store, then on a pack store, each \
         filling an empty directory, as time relative to plain, best (median of rounds), \
         alternating with plain. Cells: best ms; time relative to plain, best (median of \
         rounds), {} rounds.\n",
        config.corpus_rounds
    );
    table(
        &[
            "corpus",
            "verifier",
            "functions",
            "plain ms",
            "cold / plain: Cranelift; jitfold eager, batch (directory); eager, batch (pack)",
            "Cranelift warm (directory)",
            "jitfold eager warm (directory)",
            "jitfold batch warm (directory)",
            "jitfold eager warm (pack)",
            "jitfold batch warm (pack)",
            "jitfold batch, 2 threads, warm (pack)",
            "jitfold batch warm (Redis)",
        ],
        &rows,
    );
}

/// The Redis side of the warm starts.
#[cfg(feature = "redis")]
pub mod fleet {
    use jitfold::store::{CodeStore, RedisStore};
    use std::net::TcpStream;
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;
    use std::time::Duration;

    /// What the Redis column says when it is not measured.
    pub const MISSING: &str = "no `redis-server` found";

    /// A `redis-server` on a free loopback port, stopped when dropped.
    pub struct Server {
        child: Child,
        url: String,
    }

    impl Server {
        /// A running server, or `None` if `redis-server` cannot be run.
        pub fn start() -> Option<Server> {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .ok()?
                .local_addr()
                .ok()?
                .port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn()
                .ok()?;
            let server = Server {
                child,
                url: format!("redis://127.0.0.1:{port}/"),
            };
            for _ in 0..200 {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(server);
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            None
        }

        /// A fresh store on this server, its keys apart from other
        /// workloads'.
        pub fn store(&self, workload: &str) -> Arc<dyn CodeStore> {
            store_at(&self.url, workload)
        }

        /// The server's URL (for another process's [`store_at`]).
        pub fn url(&self) -> &str {
            &self.url
        }
    }

    /// A store on the server at `url`, its keys apart from other
    /// workloads'.
    pub fn store_at(url: &str, workload: &str) -> Arc<dyn CodeStore> {
        Arc::new(
            RedisStore::new(url)
                .expect("a loopback URL")
                .with_prefix(format!("compare:{workload}:"))
                .with_timeouts(Duration::from_secs(1), Duration::from_secs(5)),
        )
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Without the `redis` feature, no Redis side.
#[cfg(not(feature = "redis"))]
pub mod fleet {
    use jitfold::store::CodeStore;
    use std::sync::Arc;

    /// What the Redis column says when it is not measured.
    pub const MISSING: &str = "not built (`--features tools,redis`)";

    /// Never made.
    pub enum Server {}

    impl Server {
        pub fn start() -> Option<Server> {
            None
        }

        pub fn store(&self, _: &str) -> Arc<dyn CodeStore> {
            match *self {}
        }

        pub fn url(&self) -> &str {
            match *self {}
        }
    }

    /// Never called: no server is started.
    pub fn store_at(_: &str, _: &str) -> Arc<dyn CodeStore> {
        unreachable!("no Redis side without the `redis` feature")
    }
}
