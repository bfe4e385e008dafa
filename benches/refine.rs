//! Call-graph refinement: its cost on a synthetic graph of 100,000
//! functions, and against fingerprinting on each shared corpus, in one run.
//!
//! - `synthetic/refine_100k`: [`refine`] on 1,000 generic
//!   functions instantiated 100 times (each instance calls callees of its
//!   own instantiation, with cycles), where every 7th instantiation has one
//!   function that differs, so that the difference must travel back through
//!   its callers. Prints the rounds and the classes found.
//! - `<corpus>/fingerprint`: fingerprinting every function;
//!   `<corpus>/fingerprint_with_names`: the same, keeping the names the
//!   graph needs; `<corpus>/refine`: from those, template classes, the
//!   graph (a node per exact class) and refinement. The cost of refinement
//!   is `refine` plus the difference of the first two.
//!
//! Run with `cargo bench --bench refine`; ratios are printed at the end.

mod common;

use common::{corpus_dirs, mean_ns};
use cranelift_codegen::ir::Function;
use criterion::Criterion;
use jitfold::refine::{CallGraph, Node, Refinement, Target, refine};
use jitfold::{DedupCache, Fingerprint, Fingerprinter, Lookup, SymbolName};
use std::hint::black_box;

const GENERICS: u32 = 1_000;
const INSTANCES: u32 = 100;

/// A small deterministic generator (xorshift), so every run builds the same
/// graph.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

/// The synthetic graph, resolved: node `instance * GENERICS + g` with its
/// template and slot targets (callees of its own instance, then a runtime
/// import outside the set).
fn synthetic() -> (Vec<u32>, Vec<Vec<Target>>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Each generic function's template and callees (0 to 3 of them).
    let generics: Vec<(u32, Vec<u32>)> = (0..GENERICS)
        .map(|g| {
            let mut callees: Vec<u32> = Vec::new();
            for _ in 0..rng.below(4) {
                let c = rng.below(GENERICS);
                if !callees.contains(&c) {
                    callees.push(c); // slots are distinct names
                }
            }
            (g % 300, callees)
        })
        .collect();
    let (mut templates, mut slots) = (Vec::new(), Vec::new());
    for instance in 0..INSTANCES {
        let changed = rng.below(GENERICS);
        for (g, (template, callees)) in generics.iter().enumerate() {
            let differs = instance % 7 == 3 && g as u32 == changed;
            // A constant differs in this instance: another template.
            templates.push(template + if differs { 1_000 } else { 0 });
            let mut targets: Vec<Target> = callees
                .iter()
                .map(|&c| Target::Function(instance * GENERICS + c))
                .collect();
            targets.push(Target::Outside(0));
            slots.push(targets);
        }
    }
    (templates, slots)
}

/// Fingerprints with the names and address-taken flags the graph needs,
/// kept as the report keeps them: one buffer each, a range per function.
struct Fingerprinted {
    fingerprints: Vec<Fingerprint>,
    names: Vec<SymbolName>,
    taken: Vec<bool>,
    ranges: Vec<std::ops::Range<usize>>,
}

fn fingerprint_all(fp: &mut Fingerprinter, funcs: &[Function], out: &mut Fingerprinted) {
    out.fingerprints.clear();
    out.names.clear();
    out.taken.clear();
    out.ranges.clear();
    for f in funcs {
        out.fingerprints.push(fp.fingerprint(f));
        let first = out.names.len();
        out.names.extend_from_slice(fp.last_names());
        out.taken.extend_from_slice(fp.last_address_taken());
        out.ranges.push(first..out.names.len());
    }
}

/// Exact classes (as a dedup cache has them already), then the timed part
/// of `refine_corpus`.
fn exact_classes(fps: &Fingerprinted) -> Vec<Lookup> {
    let mut cache = DedupCache::new();
    fps.fingerprints
        .iter()
        .map(|fp| cache.insert(fp.clone()))
        .collect()
}

fn refine_corpus(funcs: &[Function], fps: &Fingerprinted, exact: &[Lookup]) -> Refinement {
    let mut graph = CallGraph::new();
    for (i, lookup) in exact.iter().enumerate() {
        if let Lookup::New(_) = lookup {
            let range = fps.ranges[i].clone();
            graph.add_node(
                fps.fingerprints[i].template(),
                &fps.names[range.clone()],
                &fps.taken[range],
            );
        }
        graph.add_function_with_func_name(&funcs[i].name, lookup.class().as_u32());
    }
    graph.refine()
}

fn main() {
    let mut c = Criterion::default().configure_from_args().sample_size(10);

    let (templates, slots) = synthetic();
    let nodes: Vec<Node<'_>> = templates
        .iter()
        .zip(&slots)
        .map(|(&template, slots)| Node { template, slots })
        .collect();
    let r = refine(&nodes);
    println!(
        "synthetic: {} functions, {} classes after {} rounds",
        nodes.len(),
        r.classes,
        r.rounds
    );
    let mut g = c.benchmark_group("synthetic");
    g.bench_function("refine_100k", |b| b.iter(|| black_box(refine(&nodes))));
    g.finish();

    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).expect("host ISA");
    let mut corpora = Vec::new();
    for dir in corpus_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let funcs = jitfold::corpus::valid_functions(std::slice::from_ref(&dir), Some(&*isa))
            .expect("corpus loads");
        let mut fp = Fingerprinter::new();
        let mut fps = Fingerprinted {
            fingerprints: Vec::new(),
            names: Vec::new(),
            taken: Vec::new(),
            ranges: Vec::new(),
        };
        fingerprint_all(&mut fp, &funcs, &mut fps);
        let exact = exact_classes(&fps);
        let r = refine_corpus(&funcs, &fps, &exact);
        let classes = exact.iter().filter(|l| !l.is_duplicate()).count();
        println!(
            "{name}: {} functions, {} exact classes, refined_merged {}, {} rounds",
            funcs.len(),
            classes,
            classes - r.classes,
            r.rounds
        );
        let mut g = c.benchmark_group(&name);
        g.bench_function("fingerprint", |b| {
            b.iter(|| {
                for f in &funcs {
                    black_box(fp.fingerprint(f));
                }
            })
        });
        let mut scratch = Fingerprinted {
            fingerprints: Vec::new(),
            names: Vec::new(),
            taken: Vec::new(),
            ranges: Vec::new(),
        };
        g.bench_function("fingerprint_with_names", |b| {
            b.iter(|| fingerprint_all(&mut fp, &funcs, black_box(&mut scratch)))
        });
        g.bench_function("refine", |b| {
            b.iter(|| black_box(refine_corpus(&funcs, &fps, &exact)))
        });
        g.finish();
        corpora.push(name);
    }
    c.final_summary();

    if let Some(ns) = mean_ns(&["synthetic", "refine_100k"]) {
        println!("synthetic refine, 100,000 functions: {:.1} ms", ns / 1e6);
    }
    for name in &corpora {
        if let (Some(fp), Some(with_names), Some(refine)) = (
            mean_ns(&[name, "fingerprint"]),
            mean_ns(&[name, "fingerprint_with_names"]),
            mean_ns(&[name, "refine"]),
        ) {
            // Keeping the names is refinement's cost, not fingerprinting's.
            let cost = refine + (with_names - fp).max(0.0);
            println!(
                "{name}: refinement (names kept, graph, refine) / fingerprint = {:.1}%",
                100.0 * cost / fp
            );
        }
    }
}
