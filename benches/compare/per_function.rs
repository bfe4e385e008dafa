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
//!   arguments (`common::read_only`), with no encoding and no lookup;
//! - a minimal encoding ([`MinimalEncoding`]): the floor's reads, each
//!   written as a word with arguments numbered by first sight, and the
//!   words hashed as jitfold hashes its keys; no lookup. It leaves out
//!   most of what an exact key must hold (immediates, memory flags, branch
//!   targets, the signature, the frame, callees, constants), so any exact
//!   key costs at least this much.
//! - the same minimal encoding looked up in an exact cache of it (a
//!   `hashbrown::HashMap<Vec<u32>, u32>`: hash, then compare the words):
//!   what any exact key with a lookup costs at least.
//!
//! Every cache holds every function of the corpus. Hot: functions in
//! groups of [`GROUP`], each group run once untimed and then timed, so the
//! function is in the CPU's caches as a JIT that just built it would have
//! it. Cold: one pass over the whole corpus (every shared corpus, all
//! valid functions: more than the CPU's caches hold), in file order.

use crate::common::read_only;
use crate::e2e::Corpus;
use crate::{Config, alternate, table};
use cranelift_codegen::entity::EntityRef;
use cranelift_codegen::incremental_cache::{CacheKeyHash, compute_cache_key};
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use jitfold::{DedupCache, Fingerprinter};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Functions run together, untimed then timed, in the hot measurement.
const GROUP: usize = 8;

/// The sides, in table order.
const SIDES: [&str; 6] = [
    "jitfold fingerprint + lookup",
    "text (`display()`) + HashMap lookup",
    "Cranelift `compute_cache_key` + HashMap lookup",
    "read-only floor (no encoding, no lookup)",
    "minimal encoding: the floor's reads as words, numbered, hashed (no lookup)",
    "minimal encoding + exact lookup (hashbrown map of its words)",
];

/// The least an exact key of a function costs: what the floor reads,
/// written out (opcode and result count, result types, arguments by
/// first-sight number) and hashed with jitfold's key hasher.
#[derive(Default)]
struct MinimalEncoding {
    words: Vec<u32>,
    /// Per value: 0, or its number + 1.
    numbers: Vec<u32>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl MinimalEncoding {
    fn hash(&mut self, func: &Function) -> u64 {
        self.encode(func);
        self.hasher.hash_one(&self.words[..])
    }

    /// Writes the words of `func` to `self.words`.
    fn encode(&mut self, func: &Function) {
        let dfg = &func.dfg;
        self.words.clear();
        self.words.reserve(dfg.num_insts() * 4);
        self.numbers.clear();
        self.numbers.resize(dfg.num_values(), 0);
        let mut next = 0;
        for block in func.layout.blocks() {
            let mut inst = func.layout.first_inst(block);
            while let Some(i) = inst {
                let results = dfg.inst_results(i);
                self.words
                    .push(dfg.insts[i].opcode() as u32 | (results.len() as u32) << 16);
                for &result in results {
                    self.words.push(dfg.value_type(result).index() as u32);
                    next += 1;
                    self.numbers[result.index()] = next;
                }
                for &arg in dfg.inst_args(i) {
                    self.words.push(self.numbers[arg.index()]);
                }
                inst = func.layout.next_inst(i);
            }
        }
    }
}

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
    minimal: MinimalEncoding,
    /// Every function's minimal encoding: an exact cache of that key.
    minimal_map: hashbrown::HashMap<Vec<u32>, u32>,
}

impl<'a> Sides<'a> {
    fn new(funcs: &mut [Function], isa: &'a dyn TargetIsa) -> Self {
        let mut sides = Sides {
            isa,
            fp: Fingerprinter::new(),
            exact: DedupCache::new(),
            text: HashMap::new(),
            keys: HashMap::new(),
            minimal: MinimalEncoding::default(),
            minimal_map: hashbrown::HashMap::new(),
        };
        for (i, f) in funcs.iter_mut().enumerate() {
            sides.exact.insert(sides.fp.fingerprint(f));
            sides.text.entry(text_of(f)).or_insert(i as u32);
            sides
                .keys
                .entry(compute_cache_key(isa, f))
                .or_insert(i as u32);
            sides.minimal.encode(f);
            sides
                .minimal_map
                .entry(sides.minimal.words.clone())
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
            3 => read_only(f),
            4 => self.minimal.hash(f),
            _ => {
                self.minimal.encode(f);
                let words = &self.minimal.words[..];
                self.minimal_map.get(words).copied().unwrap_or(0) as u64
            }
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
    let hot = alternate(SIDES.len(), rounds, 0, |side| sides.hot(side, &mut funcs));
    let cold = alternate(SIDES.len(), rounds, 0, |side| sides.cold(side, &mut funcs));
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
