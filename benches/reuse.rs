//! Compile once, instantiate many, against Cranelift's incremental cache,
//! on the same functions in the same run.
//!
//! For each wasm module of `../shared/corpora` (every archive but Cranelift's
//! filetests; every valid function that compiles, in file order), three ways to get machine code for all of its functions:
//!
//! - `compile_all`: `Context::compile` for each function;
//! - `cranelift_cache`: `Context::compile_with_cache` with an in-memory
//!   store that starts empty;
//! - `jitfold_reuse`: walk each function and do what jitfold's planner
//!   ([`jitfold::plan`]) says: an exact duplicate takes its class's code, a
//!   function whose template was compiled takes a retargeted copy
//!   ([`MachineCode::retarget`]), anything else is compiled (caches start
//!   empty).
//!
//! Besides criterion's runs of each way over a whole module, the three
//! ways are timed function by function in rotating order (best of three
//! passes), so that this machine's slow moments fall on all three alike;
//! those totals are the figures to compare. Run with
//! `cargo bench --bench reuse` (or `cargo bench --bench reuse -- none` for
//! the interleaved figures alone); the time each way saves over
//! `compile_all` is printed at the end.

#[allow(dead_code)]
mod common;

use common::corpus_dirs;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::incremental_cache::CacheKvStore;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::{Context, entity::SecondaryMap};
use criterion::Criterion;
use jitfold::compile::{MachineCode, compile, with_quiet_panics};
use jitfold::plan::{ClassFacts, CompiledCache, Policy, Step, Walk};
use jitfold::{ClassId, Fingerprinter, SymbolName};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Cranelift's cache store, in memory.
#[derive(Default)]
struct MemoryStore(HashMap<Vec<u8>, Vec<u8>>);

impl CacheKvStore for MemoryStore {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        self.0.get(key).map(|v| Cow::Borrowed(&v[..]))
    }

    fn insert(&mut self, key: &[u8], val: Vec<u8>) {
        self.0.insert(key.to_vec(), val);
    }
}

/// One of the three ways, one function at a time (state carries over from
/// function to function, as caches do).
trait Way {
    /// Machine code for `f`: returns its size in bytes and whether it was
    /// taken from what an earlier function compiled.
    fn code_for(&mut self, f: &Function, isa: &dyn TargetIsa) -> (usize, bool);
}

/// `Context::compile` for every function.
struct CompileAll;

impl Way for CompileAll {
    fn code_for(&mut self, f: &Function, isa: &dyn TargetIsa) -> (usize, bool) {
        let mut ctx = Context::for_function(f.clone());
        let code = ctx.compile(isa, &mut ControlPlane::default()).unwrap();
        (code.code_buffer().len(), false)
    }
}

/// `Context::compile_with_cache` with an in-memory store.
#[derive(Default)]
struct CraneliftCache(MemoryStore);

impl Way for CraneliftCache {
    fn code_for(&mut self, f: &Function, isa: &dyn TargetIsa) -> (usize, bool) {
        let mut ctx = Context::for_function(f.clone());
        let (code, hit) = ctx
            .compile_with_cache(isa, &mut self.0, &mut ControlPlane::default())
            .unwrap();
        (code.code_buffer().len(), hit)
    }
}

/// jitfold, as [the planner](jitfold::plan) decides for a module with
/// machine-code trampolines: exact duplicates take their class's code,
/// functions with a known template a retargeted copy, the others are
/// compiled (an adapter too: its own compilation, which costs more than an
/// adapter's).
#[derive(Default)]
struct JitfoldReuse {
    fp: Fingerprinter,
    compiled: CompiledCache<(Vec<SymbolName>, MachineCode)>,
    exact_code: SecondaryMap<ClassId, Option<MachineCode>>,
}

const POLICY: Policy = Policy {
    reuse: true,
    machine_trampolines: true,
    store: false,
    // As `DedupModule::<JITModule>::new` without cranelift-jit's
    // `wasmtime-unwinder` feature (this crate does not turn it on).
    compile_catching: false,
    similar: false,
};

impl Way for JitfoldReuse {
    fn code_for(&mut self, f: &Function, isa: &dyn TargetIsa) -> (usize, bool) {
        let walk = Walk::of(&mut self.fp, f);
        let plan = self.compiled.plan(&walk.planned(f), POLICY);
        let (code, copied) = match plan.steps().next().expect("a plan has a step") {
            Step::Duplicate(class) => {
                return (self.exact_code[class].as_ref().unwrap().bytes.len(), true);
            }
            Step::Reuse(t) => {
                let (names, code) = self.compiled.template_code(t);
                (code.retarget(names, &walk.names).unwrap(), true)
            }
            Step::Adapter(_) | Step::Load | Step::Similar | Step::Compile => {
                (compile(f, isa).unwrap().code, false)
            }
        };
        let class = self
            .compiled
            .add_class(walk.fingerprint, ClassFacts::default())
            .class();
        if let (false, Some(template)) = (copied, plan.keep_template) {
            self.compiled
                .keep_template(template, (walk.names, code.clone()));
        }
        if let (false, Some(body)) = (copied, plan.keep_body) {
            self.compiled.keep_body(body, class, f.signature.call_conv);
        }
        let bytes = code.bytes.len();
        self.exact_code[class] = Some(code);
        (bytes, copied)
    }
}

/// Runs `way` over all of `funcs`: total code bytes and functions whose
/// code was not compiled.
fn run(mut way: impl Way, funcs: &[Function], isa: &dyn TargetIsa) -> (usize, usize) {
    let (mut bytes, mut taken) = (0, 0);
    for f in funcs {
        let (b, t) = way.code_for(f, isa);
        bytes += b;
        taken += usize::from(t);
    }
    (bytes, taken)
}

/// The three ways timed function by function, in rotating order, so that
/// the machine's slow moments fall on all three alike: total time of each.
fn interleaved(funcs: &[Function], isa: &dyn TargetIsa) -> [Duration; 3] {
    let mut ways: [Box<dyn Way>; 3] = [
        Box::new(CompileAll),
        Box::new(CraneliftCache::default()),
        Box::new(JitfoldReuse::default()),
    ];
    let mut totals = [Duration::ZERO; 3];
    for (i, f) in funcs.iter().enumerate() {
        for k in 0..3 {
            let w = (i + k) % 3;
            let start = Instant::now();
            black_box(ways[w].code_for(f, isa));
            totals[w] += start.elapsed();
        }
    }
    totals
}

fn main() {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).expect("host ISA");
    let dirs: Vec<_> = corpus_dirs()
        .into_iter()
        .filter(|d| !d.to_string_lossy().contains("filetests"))
        .collect();
    if dirs.is_empty() {
        println!("no wasm corpora in ../shared/corpora: nothing to measure");
        return;
    }
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let mut summary = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let funcs = jitfold::corpus::valid_functions(std::slice::from_ref(dir), Some(&*isa))
            .expect("corpus loads");
        // Every function must compile, so that all three do the same work.
        let funcs: Vec<Function> = with_quiet_panics(|| {
            funcs
                .into_iter()
                .filter(|f| compile(f, &*isa).is_ok())
                .collect()
        });
        let (base_bytes, _) = run(CompileAll, &funcs, &*isa);
        let (cache_bytes, cache_hits) = run(CraneliftCache::default(), &funcs, &*isa);
        let (reuse_bytes, reuse_saved) = run(JitfoldReuse::default(), &funcs, &*isa);
        assert_eq!(
            base_bytes, cache_bytes,
            "{name}: the cache changes code size"
        );
        assert_eq!(base_bytes, reuse_bytes, "{name}: reuse changes code size");
        println!(
            "{name}: {} functions; Cranelift's cache hits {cache_hits}, jitfold compiles {} fewer",
            funcs.len(),
            reuse_saved
        );
        // Function by function, interleaved: the figure to compare.
        let mut best = [Duration::MAX; 3];
        for _ in 0..3 {
            for (b, t) in best.iter_mut().zip(interleaved(&funcs, &*isa)) {
                *b = (*b).min(t);
            }
        }
        summary.push((name.clone(), best));
        let mut g = c.benchmark_group(&name);
        g.bench_function("compile_all", |b| {
            b.iter(|| black_box(run(CompileAll, &funcs, &*isa)))
        });
        g.bench_function("cranelift_cache", |b| {
            b.iter(|| black_box(run(CraneliftCache::default(), &funcs, &*isa)))
        });
        g.bench_function("jitfold_reuse", |b| {
            b.iter(|| black_box(run(JitfoldReuse::default(), &funcs, &*isa)))
        });
        g.finish();
    }
    c.final_summary();
    for (name, [all, cache, reuse]) in &summary {
        let all = all.as_secs_f64();
        println!(
            "{name}: interleaved, best of 3: compile_all {all:.3} s; saved: Cranelift's cache {:.2}%, jitfold reuse {:.2}%",
            100.0 * (1.0 - cache.as_secs_f64() / all),
            100.0 * (1.0 - reuse.as_secs_f64() / all)
        );
    }
}
