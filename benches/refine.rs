//! Call-graph refinement: its cost on a synthetic graph of 100,000
//! functions, and against fingerprinting on each shared corpus, in one run.
//!
//! - `synthetic/layered` and `synthetic/random`: [`refine`] on 1,000
//!   generic functions instantiated 100 times (each instance calls callees
//!   of its own instantiation), where every 7th instantiation has one
//!   function that differs, so that the difference must travel back through
//!   its callers, one call level per round. `layered` is a library with
//!   call depth 8 and recursion (self and 2-cycles); `random` calls
//!   anywhere, one large cycle: the worst case for rounds. Prints the
//!   rounds and the classes found.
//! - `<corpus>/fingerprint`: fingerprinting every function;
//!   `<corpus>/exact`: the same, sorting them into exact classes;
//!   `<corpus>/exact_and_refine`: the same, adding each exact class to the
//!   call graph right after fingerprinting it, then refining as the
//!   module's batch flush does (callees of one class counted as one, see
//!   `CallGraph::refine_with`). The cost of refinement is the difference
//!   of the last two.
//!
//! Run with `cargo bench --bench refine`; ratios are printed at the end.

#[allow(dead_code)]
mod common;

use common::{corpus_dirs, mean_ns};
use cranelift_codegen::ir::Function;
use criterion::Criterion;
use jitfold::Fingerprinter;
use jitfold::plan::{ClassFacts, CompiledCache, Policy, Walk};
use jitfold::refine::{CallGraph, Node, NodeId, OutsideId, Target, TemplateId, refine};
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

/// Shape of a synthetic generic library.
#[derive(Clone, Copy)]
enum Shape {
    /// Functions in `LAYERS` layers; a function calls up to 3 functions of
    /// lower layers, and some call themselves or a neighbour (a cycle when
    /// the neighbour calls back).
    Layered,
    /// Each function calls up to 3 functions anywhere: one large cycle of
    /// calls, the worst case for the number of rounds.
    Random,
}

const LAYERS: u32 = 8;

/// A synthetic graph, resolved: node `instance * GENERICS + g` with its
/// template and slot targets (callees of its own instance, then a runtime
/// import outside the set). In every 7th instance one function has another
/// constant (another template), so its callers must split from their twins
/// in the other instances, one call level per round.
fn synthetic(shape: Shape) -> (Vec<TemplateId>, Vec<Vec<Target>>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let per_layer = GENERICS / LAYERS;
    let generics: Vec<(u32, Vec<u32>)> = (0..GENERICS)
        .map(|g| {
            let layer = g / per_layer;
            let mut callees: Vec<u32> = Vec::new();
            let mut add = |c: u32| {
                if !callees.contains(&c) {
                    callees.push(c); // slots are distinct names
                }
            };
            match shape {
                Shape::Random => (0..rng.below(4)).for_each(|_| add(rng.below(GENERICS))),
                Shape::Layered => {
                    if layer > 0 {
                        (0..rng.below(4)).for_each(|_| add(rng.below(layer * per_layer)));
                    }
                    match rng.below(8) {
                        0 => add(g),     // self-recursive
                        1 => add(g ^ 1), // a 2-cycle with its neighbour
                        _ => {}
                    }
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
            templates.push(TemplateId::from_u32(
                template + if differs { 1_000 } else { 0 },
            ));
            let mut targets: Vec<Target> = callees
                .iter()
                .map(|&c| Target::Function(NodeId::from_u32(instance * GENERICS + c)))
                .collect();
            targets.push(Target::Outside(OutsideId::from_u32(0)));
            slots.push(targets);
        }
    }
    (templates, slots)
}

/// Walks every function and sorts them into exact classes, as the
/// planner ([`jitfold::plan`]) does: each is a duplicate of a class or
/// starts one; with `graph`, also adds each new class as a node (right
/// after walking it, as batch mode does) and refines at the end. Returns
/// the classes found.
fn dedup(fp: &mut Fingerprinter, funcs: &[Function], graph: bool) -> usize {
    let policy = Policy {
        reuse: false,
        machine_trampolines: true,
        store: false,
        // As `DedupModule::<JITModule>::new` without cranelift-jit's
        // `wasmtime-unwinder` feature (this crate does not turn it on).
        compile_catching: false,
        similar: false,
    };
    let mut compiled = CompiledCache::<()>::new();
    let mut calls = graph.then(|| CallGraph::with_capacity(funcs.len()));
    // Each node's first function, walked again where it calls two
    // functions of one class (as the module's batch flush does).
    let mut first = Vec::new();
    for f in funcs {
        let walk = Walk::of(fp, f);
        let class = match compiled.plan(&walk.planned(f), policy).duplicate_of {
            Some(class) => class,
            None => {
                if let Some(calls) = &mut calls {
                    // A node per exact class, in class order.
                    calls.add_node(&walk.fingerprint, &walk.names, &walk.address_taken);
                    first.push(f);
                }
                let facts = ClassFacts::default();
                compiled.add_class(walk.fingerprint, facts).class()
            }
        };
        if let Some(calls) = &mut calls {
            calls.add_function_with_func_name(&f.name, NodeId::from_u32(class.as_u32()));
        }
    }
    match calls {
        Some(calls) => {
            calls
                .refine_with(|node| Some(first[node.as_u32() as usize]))
                .classes
        }
        None => compiled.exact().classes(),
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args().sample_size(10);

    for (shape, label) in [(Shape::Layered, "layered"), (Shape::Random, "random")] {
        let (templates, slots) = synthetic(shape);
        let nodes: Vec<Node<'_>> = templates
            .iter()
            .zip(&slots)
            .map(|(&template, slots)| Node { template, slots })
            .collect();
        let r = refine(&nodes);
        println!(
            "synthetic {label}: {} functions, {} classes after {} rounds",
            nodes.len(),
            r.classes,
            r.rounds
        );
        let mut g = c.benchmark_group("synthetic");
        g.bench_function(label, |b| b.iter(|| black_box(refine(&nodes))));
        g.finish();
    }

    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).expect("host ISA");
    let mut corpora = Vec::new();
    for dir in corpus_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let funcs = jitfold::corpus::valid_functions(std::slice::from_ref(&dir), Some(&*isa))
            .expect("corpus loads");
        let mut fp = Fingerprinter::new();
        let exact = dedup(&mut fp, &funcs, false);
        let refined = dedup(&mut fp, &funcs, true);
        println!(
            "{name}: {} functions, {exact} exact classes, refined_merged {}",
            funcs.len(),
            exact - refined,
        );
        let mut g = c.benchmark_group(&name);
        g.bench_function("fingerprint", |b| {
            b.iter(|| {
                for f in &funcs {
                    black_box(fp.fingerprint(f));
                }
            })
        });
        g.bench_function("exact", |b| {
            b.iter(|| black_box(dedup(&mut fp, &funcs, false)))
        });
        g.bench_function("exact_and_refine", |b| {
            b.iter(|| black_box(dedup(&mut fp, &funcs, true)))
        });
        g.finish();
        corpora.push(name);
    }
    c.final_summary();

    for label in ["layered", "random"] {
        if let Some(ns) = mean_ns(&["synthetic", label]) {
            println!(
                "synthetic {label}, 100,000 functions: refine {:.1} ms",
                ns / 1e6
            );
        }
    }
    for name in &corpora {
        if let (Some(fp), Some(exact), Some(refined)) = (
            mean_ns(&[name, "fingerprint"]),
            mean_ns(&[name, "exact"]),
            mean_ns(&[name, "exact_and_refine"]),
        ) {
            println!(
                "{name}: refinement (exact_and_refine - exact) / fingerprint = {:.1}%",
                100.0 * (refined - exact) / fp
            );
        }
    }
}
