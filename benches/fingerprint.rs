//! Fingerprint throughput against two baselines measured in the same run:
//! Cranelift's incremental-cache key (`compute_cache_key`) on the same
//! functions, and Cranelift's own compilation at `opt_level=speed` on a
//! sample of them. A third measurement, `read_only`, is a floor rather than
//! a baseline: it reads what any fingerprint must read of each instruction
//! (layout order, opcode, results and their types, value arguments) and
//! encodes nothing, so the fingerprint's cost beyond it is the cost of
//! the encoding and hashing themselves.
//!
//! Input: every valid function of the archives in `../shared/corpora`
//! (unpacked once into `target/jitfold-bench-corpora`), or, when that
//! folder is absent, 5,000 functions of the fuzz generator (which needs
//! `--features fuzzing`). Run with `cargo bench --bench fingerprint`; the
//! ratios are printed at the end.

#[allow(dead_code)]
mod common;

use common::{corpus_dirs, mean_ns, read_only};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::incremental_cache::compute_cache_key;
use cranelift_codegen::ir::Function;
use criterion::{Criterion, Throughput};
use jitfold::Fingerprinter;
use jitfold::compile::{compile, with_quiet_panics};
use std::hint::black_box;

fn load_functions(isa: &dyn cranelift_codegen::isa::TargetIsa) -> (String, Vec<Function>) {
    let dirs = corpus_dirs();
    if dirs.is_empty() {
        return ("synthetic".into(), synthetic());
    }
    let funcs = jitfold::corpus::valid_functions(&dirs, Some(isa)).expect("corpora load");
    ("shared corpora".into(), funcs)
}

/// One function of the fuzz generator per seed, 5,000 of them.
#[cfg(all(feature = "fuzzing", unix))]
fn synthetic() -> Vec<Function> {
    use jitfold::fuzzing::program::{Body, Variant, standalone};
    (0..5000)
        .filter_map(|seed| Body::from_seed(seed, 2))
        .map(|body| standalone(&body, 2, 0, Variant::default()))
        .collect()
}

#[cfg(not(all(feature = "fuzzing", unix)))]
fn synthetic() -> Vec<Function> {
    eprintln!("no corpora in ../shared/corpora; the synthetic set needs `--features fuzzing`");
    std::process::exit(2)
}

fn main() {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).expect("host ISA");
    let (source, funcs) = load_functions(&*isa);
    let mut fp = Fingerprinter::new();
    let instructions: u64 = funcs
        .iter()
        .map(|f| u64::from(fp.fingerprint(f).instructions()))
        .sum();

    // A sample for compilation: every function that compiles for the host,
    // thinned to about 40,000 instructions.
    let step = (instructions / 40_000).max(1) as usize;
    // (Some of Cranelift's own filetests make its x64 backend panic, e.g.
    // `f16` without the needed CPU features; those are left out.)
    let sample: Vec<&Function> = with_quiet_panics(|| {
        funcs
            .iter()
            .step_by(step)
            .filter(|f| compile(f, &*isa).is_ok())
            .collect()
    });
    let sample_insts: u64 = sample
        .iter()
        .map(|f| u64::from(fp.fingerprint(f).instructions()))
        .sum();
    println!(
        "{source}: {} functions, {instructions} instructions; compile sample {} functions, {sample_insts} instructions",
        funcs.len(),
        sample.len()
    );

    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let mut all = c.benchmark_group("all");
    all.throughput(Throughput::Elements(instructions));
    all.bench_function("fingerprint", |b| {
        b.iter(|| {
            for f in &funcs {
                black_box(fp.fingerprint(f));
            }
        })
    });
    all.bench_function("read_only", |b| {
        b.iter(|| {
            for f in &funcs {
                black_box(read_only(black_box(f)));
            }
        })
    });
    all.bench_function("cache_key", |b| {
        b.iter(|| {
            for f in &funcs {
                black_box(compute_cache_key(&*isa, f));
            }
        })
    });
    all.finish();

    let mut s = c.benchmark_group("sample");
    s.throughput(Throughput::Elements(sample_insts));
    s.bench_function("fingerprint", |b| {
        b.iter(|| {
            for f in &sample {
                black_box(fp.fingerprint(f));
            }
        })
    });
    s.bench_function("compile_speed", |b| {
        b.iter(|| {
            for f in &sample {
                let mut ctx = cranelift_codegen::Context::for_function((*f).clone());
                black_box(ctx.compile(&*isa, &mut ControlPlane::default()).is_ok());
            }
        })
    });
    s.finish();
    c.final_summary();

    // Ratios from this run's estimates.
    if let (Some(fpa), Some(floor), Some(key), Some(fps), Some(comp)) = (
        mean_ns(&["all", "fingerprint"]),
        mean_ns(&["all", "read_only"]),
        mean_ns(&["all", "cache_key"]),
        mean_ns(&["sample", "fingerprint"]),
        mean_ns(&["sample", "compile_speed"]),
    ) {
        println!(
            "fingerprint:        {:.2} ns/instruction",
            fpa / instructions as f64
        );
        println!(
            "read only (floor):  {:.2} ns/instruction",
            floor / instructions as f64
        );
        println!(
            "cache key:          {:.2} ns/instruction",
            key / instructions as f64
        );
        println!(
            "compile (speed):    {:.1} ns/instruction",
            comp / sample_insts as f64
        );
        println!("cache key / fingerprint:   {:.2}x", key / fpa);
        println!("fingerprint / read only:   {:.2}x", fpa / floor);
        println!("fingerprint / compile:     {:.3}%", 100.0 * fps / comp);
    }
}
