//! Per function: what it costs to find a function in a cache that holds
//! it, from the `ir::Function`, three ways, with the read-only floor:
//!
//! - jitfold: the fingerprint walk, then a lookup of the borrowed key in
//!   the exact cache (`DedupCache::get_borrowed`, the hit path of
//!   `DedupModule`);
//! - text: `func.display()` to a `String` (with the function's own name
//!   cleared first, so that equal bodies print equal), then a lookup in a
//!   `std::collections::HashMap<String, u32>`;
//! - Cranelift's key: `compute_cache_key`, then a lookup in a
//!   `HashMap<CacheKeyHash, u32>`;
//! - the floor: reading each instruction's opcode, result types and
//!   arguments (`common::read_only`), with no encoding and no lookup.
//!
//! Every cache holds every function of the corpus. Hot: functions in
//! groups of [`GROUP`], each group run once untimed and then timed, so the
//! function is in the CPU's caches as a JIT that just built it would have
//! it. Cold: one pass over the whole corpus (every shared corpus, all
//! valid functions: more than the CPU's caches hold), in file order.

use crate::common::read_only;
use crate::e2e::Corpus;
use crate::{Config, alternate, table};
use cranelift_codegen::incremental_cache::{CacheKeyHash, compute_cache_key};
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use jitfold::{DedupCache, Fingerprinter};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Functions run together, untimed then timed, in the hot measurement.
const GROUP: usize = 8;

/// The sides, in table order.
const SIDES: [&str; 4] = [
    "jitfold fingerprint + lookup",
    "text (`display()`) + HashMap lookup",
    "Cranelift `compute_cache_key` + HashMap lookup",
    "read-only floor (no encoding, no lookup)",
];

/// The text a text-keyed map hashes: the function printed without its
/// own name.
pub fn text_of(func: &mut Function) -> String {
    let name = std::mem::take(&mut func.name);
    let text = func.display().to_string();
    func.name = name;
    text
}

/// Each side's state: its cache, holding every function.
struct Sides<'a> {
    isa: &'a dyn TargetIsa,
    fp: Fingerprinter,
    exact: DedupCache,
    text: HashMap<String, u32>,
    keys: HashMap<CacheKeyHash, u32>,
}

impl<'a> Sides<'a> {
    fn new(funcs: &mut [Function], isa: &'a dyn TargetIsa) -> Self {
        let mut sides = Sides {
            isa,
            fp: Fingerprinter::new(),
            exact: DedupCache::new(),
            text: HashMap::new(),
            keys: HashMap::new(),
        };
        for (i, f) in funcs.iter_mut().enumerate() {
            sides.exact.insert(sides.fp.fingerprint(f));
            sides.text.entry(text_of(f)).or_insert(i as u32);
            sides
                .keys
                .entry(compute_cache_key(isa, f))
                .or_insert(i as u32);
        }
        sides
    }

    /// Side `side` on `f`: what it found, as a number.
    fn run(&mut self, side: usize, f: &mut Function) -> u64 {
        match side {
            0 => {
                let key = self.fp.walk(f).key();
                self.exact
                    .get_borrowed(&key)
                    .map_or(0, |c| c.as_u32() as u64)
            }
            1 => self.text.get(&text_of(f)).copied().unwrap_or(0) as u64,
            2 => self
                .keys
                .get(&compute_cache_key(self.isa, f))
                .copied()
                .unwrap_or(0) as u64,
            _ => read_only(f),
        }
    }

    fn hot(&mut self, side: usize, funcs: &mut [Function]) -> Duration {
        let mut total = Duration::ZERO;
        for group in funcs.chunks_mut(GROUP) {
            for f in group.iter_mut() {
                black_box(self.run(side, f));
            }
            let start = Instant::now();
            for f in group.iter_mut() {
                black_box(self.run(side, f));
            }
            total += start.elapsed();
        }
        total
    }

    fn cold(&mut self, side: usize, funcs: &mut [Function]) -> Duration {
        let start = Instant::now();
        for f in funcs.iter_mut() {
            black_box(self.run(side, f));
        }
        start.elapsed()
    }
}

/// Prints the per-function table.
pub fn print(corpora: &[Corpus], isa: &dyn TargetIsa, config: &Config) {
    let mut funcs: Vec<Function> = corpora.iter().flat_map(|c| c.all.clone()).collect();
    let mut fp = Fingerprinter::new();
    let instructions: u64 = funcs
        .iter()
        .map(|f| u64::from(fp.fingerprint(f).instructions()))
        .sum();
    eprintln!("per function: {} functions", funcs.len());
    let mut sides = Sides::new(&mut funcs, isa);
    let rounds = config.per_function_rounds;
    let hot = alternate(4, rounds, 0, |side| sides.hot(side, &mut funcs));
    let cold = alternate(4, rounds, 0, |side| sides.cold(side, &mut funcs));
    let per_inst = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e9 / instructions as f64);
    println!(
        "### 1. Per function: from `ir::Function` to its entry in a cache that holds it\n\n\
         {} functions, {instructions} instructions (every valid function of the shared \
         corpora; each cache holds all of them). Hot: groups of {GROUP} functions, each run \
         once untimed, then timed. Cold: one pass over all, in file order. ns/instruction: \
         best (median) of {rounds} alternating rounds. Time relative to jitfold: best against \
         best (median of the rounds' ratios).\n",
        funcs.len()
    );
    let rows: Vec<Vec<String>> = SIDES
        .iter()
        .enumerate()
        .map(|(s, name)| {
            vec![
                name.to_string(),
                format!("{} ({})", per_inst(hot.best[s]), per_inst(hot.median[s])),
                hot.ratio(s),
                format!("{} ({})", per_inst(cold.best[s]), per_inst(cold.median[s])),
                cold.ratio(s),
            ]
        })
        .collect();
    table(
        &[
            "way",
            "hot ns/inst",
            "hot time / jitfold's",
            "cold ns/inst",
            "cold time / jitfold's",
        ],
        &rows,
    );
}
