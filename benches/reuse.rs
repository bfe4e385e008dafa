//! Compile once, instantiate many, against Cranelift's incremental cache,
//! on the same functions in the same run.
//!
//! For each wasm module of `../shared/corpora` (every archive but Cranelift's
//! filetests; every valid function that compiles, in file order), three ways to get machine code for all of its functions:
//!
//! - `compile_all`: `Context::compile` for each function;
//! - `cranelift_cache`: `Context::compile_with_cache` with an in-memory
//!   store that starts empty;
//! - `jitfold_reuse`: fingerprint each function; an exact duplicate takes
//!   its class's code, a function whose template was compiled takes a
//!   retargeted copy ([`MachineCode::retarget`]), anything else is compiled
//!   (caches start empty).
//!
//! Run with `cargo bench --bench reuse`; the time each way saves over
//! `compile_all` is printed at the end.

mod common;

use common::{corpus_dirs, mean_ns};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::incremental_cache::CacheKvStore;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::{Context, entity::SecondaryMap};
use criterion::Criterion;
use jitfold::compile::{MachineCode, compile, with_quiet_panics};
use jitfold::{ClassId, DedupCache, Fingerprinter, Lookup, SymbolName};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hint::black_box;

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

fn compile_all(funcs: &[Function], isa: &dyn TargetIsa) -> usize {
    let mut bytes = 0;
    for f in funcs {
        let mut ctx = Context::for_function(f.clone());
        let code = ctx.compile(isa, &mut ControlPlane::default()).unwrap();
        bytes += code.code_buffer().len();
    }
    bytes
}

fn cranelift_cache(funcs: &[Function], isa: &dyn TargetIsa) -> (usize, usize) {
    let mut store = MemoryStore::default();
    let (mut bytes, mut hits) = (0, 0);
    for f in funcs {
        let mut ctx = Context::for_function(f.clone());
        let (code, hit) = ctx
            .compile_with_cache(isa, &mut store, &mut ControlPlane::default())
            .unwrap();
        bytes += code.code_buffer().len();
        hits += usize::from(hit);
    }
    (bytes, hits)
}

/// Machine code for every function, compiling only one function per
/// template. Returns the code bytes and the number of functions that were
/// not compiled.
fn jitfold_reuse(funcs: &[Function], isa: &dyn TargetIsa) -> (usize, usize) {
    let mut fp = Fingerprinter::new();
    let mut exact = DedupCache::new();
    let mut templates = DedupCache::new();
    let mut exact_code: SecondaryMap<ClassId, Option<MachineCode>> = SecondaryMap::new();
    let mut template_code: SecondaryMap<ClassId, Option<(Vec<SymbolName>, MachineCode)>> =
        SecondaryMap::new();
    let (mut bytes, mut saved) = (0, 0);
    for f in funcs {
        let key = fp.fingerprint(f);
        let template = key.template();
        let class = match exact.insert(key) {
            Lookup::Duplicate(class) => {
                bytes += exact_code[class].as_ref().unwrap().bytes.len();
                saved += 1;
                continue;
            }
            Lookup::New(class) => class,
        };
        let code = match templates.insert(template) {
            Lookup::Duplicate(t) => {
                let (names, code) = template_code[t].as_ref().unwrap();
                saved += 1;
                code.retarget(names, fp.last_names()).unwrap()
            }
            Lookup::New(t) => {
                let code = compile(f, isa).unwrap().code;
                template_code[t] = Some((fp.last_names().to_vec(), code.clone()));
                code
            }
        };
        bytes += code.bytes.len();
        exact_code[class] = Some(code);
    }
    (bytes, saved)
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
    let mut corpora = Vec::new();
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
        let base_bytes = compile_all(&funcs, &*isa);
        let (cache_bytes, cache_hits) = cranelift_cache(&funcs, &*isa);
        let (reuse_bytes, reuse_saved) = jitfold_reuse(&funcs, &*isa);
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
        let mut g = c.benchmark_group(&name);
        g.bench_function("compile_all", |b| {
            b.iter(|| black_box(compile_all(&funcs, &*isa)))
        });
        g.bench_function("cranelift_cache", |b| {
            b.iter(|| black_box(cranelift_cache(&funcs, &*isa)))
        });
        g.bench_function("jitfold_reuse", |b| {
            b.iter(|| black_box(jitfold_reuse(&funcs, &*isa)))
        });
        g.finish();
        corpora.push(name);
    }
    c.final_summary();
    for name in &corpora {
        if let (Some(all), Some(cache), Some(reuse)) = (
            mean_ns(&[name, "compile_all"]),
            mean_ns(&[name, "cranelift_cache"]),
            mean_ns(&[name, "jitfold_reuse"]),
        ) {
            println!(
                "{name}: saved over compile_all: Cranelift's cache {:.2}%, jitfold reuse {:.2}%",
                100.0 * (1.0 - cache / all),
                100.0 * (1.0 - reuse / all)
            );
        }
    }
}
