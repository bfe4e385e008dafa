//! Warm starts through a persistent store, against Cranelift's incremental
//! cache, on the same functions in the same run.
//!
//! For each wasm module of `../shared/corpora` (every valid function that
//! compiles, in file order), the time from `ir::Function`s to machine code
//! for all of them:
//!
//! - `compile_all`: `Context::compile` for each;
//! - `cranelift`: `Context::compile_with_cache` with a `CacheKvStore` on a
//!   directory (one file per key, written to a temporary file and renamed),
//!   cold (empty directory) and warm (the directory the cold pass filled);
//! - `jitfold`: each function walked, its template looked up in a
//!   `DirectoryStore`, the entry checked and retargeted to its names
//!   through the one load path every user of the store takes
//!   (`jitfold::store::load::check`, as a JIT module checks it: a hit),
//!   or the function compiled and its entry stored (a miss), cold and
//!   warm. Nothing is defined in a module: this measures the store, not a
//!   warm start of `DedupModule` (the compare bench's table 4 does).
//!
//! Each of [`ROUNDS`] rounds runs every pass once, in turns, with fresh
//! directories; the best time of each pass is printed with the ratios, and
//! the bytes each store holds per function. criterion also times the two
//! warm passes on each module. Run with
//! `cargo bench --features tools --bench store` (`-- none` for the printed
//! figures alone).

#[allow(dead_code)]
mod common;

use common::{DirKv, corpus_dirs, size_of_dir};
use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use criterion::Criterion;
use jitfold::code::MachineCode;
use jitfold::compile::{compile, with_quiet_panics};
use jitfold::plan::Walk;
use jitfold::store::load::{Checks, check};
use jitfold::store::{CodeContext, CodeStore, DirectoryStore, Entry, StoreKey};
use jitfold::{Fingerprinter, SymbolName, Template};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const ROUNDS: usize = 3;

fn compile_all(funcs: &[Function], isa: &dyn TargetIsa) -> Duration {
    let start = Instant::now();
    for f in funcs {
        let mut ctx = Context::for_function(f.clone());
        black_box(ctx.compile(isa, &mut ControlPlane::default()).unwrap());
    }
    start.elapsed()
}

/// A pass of Cranelift's cache: its time and hits.
fn cranelift(funcs: &[Function], isa: &dyn TargetIsa, store: &mut DirKv) -> (Duration, usize) {
    let mut hits = 0;
    let start = Instant::now();
    for f in funcs {
        let mut ctx = Context::for_function(f.clone());
        let (_, hit) = ctx
            .compile_with_cache(isa, store, &mut ControlPlane::default())
            .unwrap();
        hits += usize::from(hit);
    }
    (start.elapsed(), hits)
}

/// A pass of jitfold's store: its time and hits.
fn jitfold(
    funcs: &[Function],
    isa: &dyn TargetIsa,
    store: &dyn CodeStore,
    context: &CodeContext,
) -> (Duration, usize) {
    let mut hits = 0;
    let mut walker = Fingerprinter::new();
    let start = Instant::now();
    for f in funcs {
        let walk = Walk::of(&mut walker, f);
        let template = walk.fingerprint.to_template();
        let key = StoreKey::of(context, &template);
        let loaded = store
            .get(&key)
            .ok()
            .flatten()
            .and_then(|bytes| code_of(&bytes, isa, context, &template, &walk.names));
        if let Some(code) = loaded {
            black_box(code);
            hits += 1;
            continue;
        }
        let compiled = compile(f, isa).unwrap();
        let unwind = compiled.unwind.as_ref();
        if let Some(entry) = Entry::new(
            &template,
            &walk.names,
            &compiled.code,
            compiled.time,
            unwind,
        ) {
            let _ = store.put(&key, &entry.encode(context, None));
        }
    }
    (start.elapsed(), hits)
}

/// A warm pass of jitfold's store as a batch flush makes it: every
/// function walked, all their templates looked up in one
/// [`CodeStore::get_many`], then each entry decoded and retargeted. Its
/// time and hits.
#[cfg(feature = "redis")]
fn jitfold_batched(
    funcs: &[Function],
    isa: &dyn TargetIsa,
    store: &dyn CodeStore,
    context: &CodeContext,
) -> (Duration, usize) {
    let mut walker = Fingerprinter::new();
    let start = Instant::now();
    let walked: Vec<_> = funcs
        .iter()
        .map(|f| {
            let walk = Walk::of(&mut walker, f);
            (walk.fingerprint.to_template(), walk.names.clone())
        })
        .collect();
    let keys: Vec<StoreKey> = walked
        .iter()
        .map(|(template, _)| StoreKey::of(context, template))
        .collect();
    let values = store.get_many(&keys).unwrap_or_default();
    let mut hits = 0;
    for ((template, names), bytes) in walked.iter().zip(values) {
        let loaded = bytes.and_then(|bytes| code_of(&bytes, isa, context, template, names));
        if let Some(code) = loaded {
            black_box(code);
            hits += 1;
        }
    }
    (start.elapsed(), hits)
}

/// The code of the entry in `bytes` for `template`, retargeted to `names`,
/// if it passes every check of the one load path
/// ([`jitfold::store::load::check`], as a JIT module checks it).
fn code_of(
    bytes: &[u8],
    isa: &dyn TargetIsa,
    context: &CodeContext,
    template: &Template,
    names: &[SymbolName],
) -> Option<MachineCode> {
    let checks = Checks {
        context,
        secret: None,
        isa,
        needs_unwind: false,
    };
    check(bytes, &checks, template.key(), names)
        .ok()
        .map(|l| l.code)
}

/// A fresh, empty directory for this bench.
fn scratch(name: &str) -> PathBuf {
    common::scratch("store", name)
}

/// Through a `redis-server` on a loopback port (started here, if it is
/// installed): a cold pass, then warm passes as a second process of the
/// fleet would make them (the server holds everything); the best warm
/// time and lookups per second.
#[cfg(feature = "redis")]
fn redis(funcs: &[Function], isa: &dyn TargetIsa, context: &CodeContext) -> Option<String> {
    let port = 16_379 + (std::process::id() % 1000) as u16;
    let mut server = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(300));
    let store = jitfold::store::RedisStore::new(&format!("redis://127.0.0.1:{port}"))
        .ok()?
        .with_timeouts(Duration::from_secs(1), Duration::from_secs(1));
    let (cold, _) = jitfold(funcs, isa, &store, context);
    let (mut warm, mut batched) = ((Duration::MAX, 0), (Duration::MAX, 0));
    for _ in 0..ROUNDS {
        warm = warm.min(jitfold(funcs, isa, &store, context));
        batched = batched.min(jitfold_batched(funcs, isa, &store, context));
    }
    let _ = server.kill();
    let _ = server.wait();
    let n = funcs.len() as f64;
    Some(format!(
        "through Redis on loopback: cold {:.3} s, warm {:.3} s ({} of {} functions loaded, {:.0} \
         lookups per second, each key, get, decode and retarget); warm with one `get_many` as a \
         batch flush asks: {:.3} s ({} loaded, {:.0} lookups per second, {:.1}x faster)",
        cold.as_secs_f64(),
        warm.0.as_secs_f64(),
        warm.1,
        funcs.len(),
        n / warm.0.as_secs_f64(),
        batched.0.as_secs_f64(),
        batched.1,
        n / batched.0.as_secs_f64(),
        warm.0.as_secs_f64() / batched.0.as_secs_f64(),
    ))
}

/// Without the `redis` feature, nothing.
#[cfg(not(feature = "redis"))]
fn redis(_: &[Function], _: &dyn TargetIsa, _: &CodeContext) -> Option<String> {
    None
}

fn main() {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).expect("host ISA");
    let context = CodeContext::of(&*isa);
    let mut criterion = Criterion::default().configure_from_args();
    let mut lines = Vec::new();
    for dir in corpus_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if name.contains("filetests") {
            continue;
        }
        let funcs: Vec<Function> =
            jitfold::corpus::valid_functions(std::slice::from_ref(&dir), Some(&*isa))
                .expect("corpus loads")
                .into_iter()
                .filter(|f| with_quiet_panics(|| compile(f, &*isa)).is_ok())
                .collect();
        let n = funcs.len();
        let mut best = [Duration::MAX; 5];
        let (mut cl_bytes, mut jf_bytes, mut hits) = (0, 0, (0, 0));
        for round in 0..ROUNDS {
            let (cl_dir, jf_dir) = (scratch("cranelift"), scratch("jitfold"));
            let mut cl_store = DirKv(cl_dir.clone());
            let jf_store = DirectoryStore::new(&jf_dir)
                .unwrap()
                .with_limit(u64::MAX / 2);
            let times = [
                compile_all(&funcs, &*isa),
                cranelift(&funcs, &*isa, &mut cl_store).0,
                jitfold(&funcs, &*isa, &jf_store, &context).0,
                {
                    let (t, h) = cranelift(&funcs, &*isa, &mut cl_store);
                    hits.0 = h;
                    t
                },
                {
                    let (t, h) = jitfold(&funcs, &*isa, &jf_store, &context);
                    hits.1 = h;
                    t
                },
            ];
            for (b, t) in best.iter_mut().zip(times) {
                *b = (*b).min(t);
            }
            cl_bytes = size_of_dir(&cl_dir);
            jf_bytes = size_of_dir(&jf_dir);
            if round + 1 == ROUNDS {
                let mut group = criterion.benchmark_group(format!("warm/{name}"));
                group.sample_size(10);
                group.bench_function("cranelift_cache", |b| {
                    b.iter(|| cranelift(&funcs, &*isa, &mut cl_store))
                });
                group.bench_function("jitfold_store", |b| {
                    b.iter(|| jitfold(&funcs, &*isa, &jf_store, &context))
                });
                group.finish();
            }
            let _ = std::fs::remove_dir_all(&cl_dir);
            let _ = std::fs::remove_dir_all(&jf_dir);
        }
        if let Some(line) = redis(&funcs, &*isa, &context) {
            lines.push(format!("{name}: {line}"));
        }
        let [all, cl_cold, jf_cold, cl_warm, jf_warm] = best.map(|d| d.as_secs_f64());
        lines.push(format!(
            "{name}: {n} functions, best of {ROUNDS}: compile_all {all:.3} s; cold: cranelift \
             {cl_cold:.3} s, jitfold {jf_cold:.3} s; warm: cranelift {cl_warm:.3} s ({} hits, \
             {:.1}x faster than compile_all), jitfold {jf_warm:.3} s ({} hits, {:.1}x faster than \
             compile_all, {:.1}x faster than cranelift warm); stored per function: cranelift {} \
             bytes, jitfold {} bytes",
            hits.0,
            all / cl_warm,
            hits.1,
            all / jf_warm,
            cl_warm / jf_warm,
            cl_bytes / n.max(1) as u64,
            jf_bytes / n.max(1) as u64,
        ));
    }
    criterion.final_summary();
    for line in lines {
        println!("{line}");
    }
}
