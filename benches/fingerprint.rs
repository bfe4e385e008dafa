use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jitfold::Fingerprinter;
use std::path::PathBuf;

fn bench(c: &mut Criterion) {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    let dir = PathBuf::from(std::env::var("CORPUS").unwrap());
    let funcs = jitfold::corpus::valid_functions(&[dir], Some(&*isa)).unwrap();
    let mut fp = Fingerprinter::new();
    let insts: u64 = funcs.iter().map(|f| fp.fingerprint(f).instructions() as u64).sum();
    let mut g = c.benchmark_group("fp");
    g.throughput(Throughput::Elements(insts));
    g.bench_function("fingerprint", |b| b.iter(|| {
        for f in &funcs { std::hint::black_box(fp.fingerprint(f)); }
    }));
    g.bench_function("cache_key", |b| b.iter(|| {
        for f in &funcs { std::hint::black_box(cranelift_codegen::incremental_cache::compute_cache_key(&*isa, f)); }
    }));
    let big = funcs.iter().max_by_key(|f| f.layout.blocks().count()).unwrap();
    let n = fp.fingerprint(big).instructions();
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("one-hot", |b| b.iter(|| std::hint::black_box(fp.fingerprint(big))));
    let mut k = 0; 
    let mid: Vec<_> = funcs.iter().filter(|f| { k+=1; k % 50 == 0}).collect();
    let n: u64 = mid.iter().map(|f| fp.fingerprint(f).instructions() as u64).sum();
    g.throughput(Throughput::Elements(n));
    g.bench_function("sample50", |b| b.iter(|| {
        for f in &mid { std::hint::black_box(fp.fingerprint(f)); }
    }));
}
criterion_group!(benches, bench);
criterion_main!(benches);
