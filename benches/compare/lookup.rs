//! Lookup latency and memory per entry, with 10³, 10⁵ and 10⁶ entries, in
//! three caches of keys (no code in any of them):
//!
//! - jitfold's exact cache (`DedupCache<Fingerprint>`, the cache
//!   `DedupModule` looks functions up in), probed with a borrowed key
//!   (`get_borrowed`, the module's hit path);
//! - a `std::collections::HashMap<String, u32>` keyed by the name-less text;
//! - a `HashMap<CacheKeyHash, u32>` keyed by Cranelift's cache key.
//!
//! Entries are one 9-instruction function with a different constant each.
//! Latency: each lookup of a key already computed (a hit, at random), read
//! just before so that it is in the CPU's caches as a key just computed
//! is, timed alone with `Instant`, the timer's own median cost subtracted.
//! Memory: heap bytes the cache holds after all insertions, counted by the
//! bench's global allocator, divided by the entries.

use crate::per_function::text_of;
use crate::{Config, live_bytes_of, median, table};
use cranelift_codegen::incremental_cache::compute_cache_key;
use cranelift_codegen::ir::{
    AbiParam, Function, Inst, InstBuilder, InstructionData, Opcode, Signature, UserFuncName,
    immediates::Imm64, types::I64,
};
use cranelift_codegen::isa::TargetIsa;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use jitfold::{DedupCache, Fingerprinter};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

const SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];

/// The entries' function, and its constant's instruction.
fn base_function(isa: &dyn TargetIsa) -> (Function, Inst) {
    let mut sig = Signature::new(isa.default_call_conv());
    sig.params.extend([AbiParam::new(I64), AbiParam::new(I64)]);
    sig.returns.push(AbiParam::new(I64));
    let mut func = Function::with_name_signature(UserFuncName::user(0, 0), sig);
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let (x, y) = (b.block_params(entry)[0], b.block_params(entry)[1]);
    let c = b.ins().iconst(I64, 0);
    let t = b.ins().imul(x, c);
    let t = b.ins().bxor(t, y);
    let t = b.ins().iadd(t, x);
    let t = b.ins().isub(t, c);
    let t = b.ins().band(t, y);
    let t = b.ins().bor(t, x);
    let t = b.ins().imul(t, t);
    b.ins().return_(&[t]);
    b.seal_all_blocks();
    b.finalize(isa.frontend_config());
    let inst = func.dfg.value_def(c).unwrap_inst();
    (func, inst)
}

fn set_constant(f: &mut Function, inst: Inst, k: usize) {
    f.dfg.insts[inst] = InstructionData::UnaryImm {
        opcode: Opcode::Iconst,
        imm: Imm64::new(k as i64 * 0x9e37_79b9 + 1),
    };
}

/// A pseudo-random sequence of `count` indices below `n`.
fn random_indices(n: usize, count: usize) -> Vec<usize> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        })
        .collect()
}

/// The median cost of timing nothing, in ns.
fn timer_cost() -> f64 {
    median(
        (0..10_000)
            .map(|_| {
                let start = Instant::now();
                start.elapsed().as_secs_f64() * 1e9
            })
            .collect(),
    )
}

/// Median and 99th percentile, in ns, of `lookup(i)` for each probe `i`,
/// each after `warm(i)` (which reads the probe's key, as a JIT that just
/// computed it has it in its caches).
fn latency(
    probes: usize,
    overhead: f64,
    mut warm: impl FnMut(usize) -> u64,
    mut lookup: impl FnMut(usize) -> bool,
) -> (f64, f64) {
    let mut times: Vec<f64> = (0..probes)
        .map(|i| {
            black_box(warm(i));
            let start = Instant::now();
            let found = black_box(lookup(i));
            let t = start.elapsed().as_secs_f64() * 1e9;
            assert!(found, "every probe is in the cache");
            (t - overhead).max(0.0)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[times.len() * 99 / 100])
}

/// One row per cache and size: entries, bytes per entry, median, p99.
fn rows(isa: &dyn TargetIsa, probes: usize) -> Vec<Vec<String>> {
    let overhead = timer_cost();
    let (mut f, inst) = base_function(isa);
    let mut fp = Fingerprinter::new();
    black_box(fp.fingerprint(&f));
    let mut out = Vec::new();
    let mut row = |name: &str, n: usize, bytes: isize, (median, p99): (f64, f64)| {
        out.push(vec![
            name.to_string(),
            n.to_string(),
            format!("{:.0}", bytes as f64 / n as f64),
            format!("{median:.0}"),
            format!("{p99:.0}"),
        ]);
    };
    for n in SIZES {
        eprintln!("lookup: {n} entries");
        let picks = random_indices(n, probes);
        let (bytes, cache) = live_bytes_of(|| {
            let mut cache = DedupCache::new();
            for k in 0..n {
                set_constant(&mut f, inst, k);
                cache.insert(fp.fingerprint(&f));
            }
            cache
        });
        let keys: Vec<_> = picks
            .iter()
            .map(|&k| {
                set_constant(&mut f, inst, k);
                fp.fingerprint(&f)
            })
            .collect();
        let lat = latency(
            probes,
            overhead,
            |i| keys[i].key().iter().map(|&w| u64::from(w)).sum(),
            |i| cache.get_borrowed(&keys[i].borrowed()).is_some(),
        );
        row("jitfold exact cache (`DedupCache`)", n, bytes, lat);
        drop((cache, keys));

        let (bytes, map) = live_bytes_of(|| {
            let mut map = HashMap::new();
            for k in 0..n {
                set_constant(&mut f, inst, k);
                map.insert(text_of(&mut f), k as u32);
            }
            map
        });
        let keys: Vec<String> = picks
            .iter()
            .map(|&k| {
                set_constant(&mut f, inst, k);
                text_of(&mut f)
            })
            .collect();
        let lat = latency(
            probes,
            overhead,
            |i| keys[i].bytes().map(u64::from).sum(),
            |i| map.contains_key(keys[i].as_str()),
        );
        row("text map (`HashMap<String, u32>`)", n, bytes, lat);
        drop((map, keys));

        let (bytes, map) = live_bytes_of(|| {
            let mut map = HashMap::new();
            for k in 0..n {
                set_constant(&mut f, inst, k);
                map.insert(compute_cache_key(isa, &f), k as u32);
            }
            map
        });
        let keys: Vec<_> = picks
            .iter()
            .map(|&k| {
                set_constant(&mut f, inst, k);
                compute_cache_key(isa, &f)
            })
            .collect();
        let lat = latency(
            probes,
            overhead,
            |i| u64::from(&keys[i] == black_box(&keys[i])),
            |i| map.contains_key(&keys[i]),
        );
        row(
            "Cranelift key map (`HashMap<CacheKeyHash, u32>`)",
            n,
            bytes,
            lat,
        );
    }
    out
}

/// Prints the lookup table.
pub fn print(config: &Config) {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).expect("host ISA");
    let rows = rows(&*isa, config.probes);
    println!(
        "### 5. Lookup latency and memory per cached entry\n\n\
         Entries: one 9-instruction function, a different constant each. Latency: {} hits at \
         random, each timed alone, its key computed before and read just before (in the CPU's caches), timer cost ({:.0} ns median) \
         subtracted. Memory: heap bytes the cache holds, counted by a global allocator, per \
         entry (keys and table; no code).\n",
        config.probes,
        timer_cost()
    );
    table(
        &["cache", "entries", "bytes/entry", "median ns", "p99 ns"],
        &rows,
    );
}
