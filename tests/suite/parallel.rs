//! Parallel compilation in batch mode (`DedupOptions::threads`): a batch of
//! many functions (distinct ones, callers of each other, exact twins,
//! callers of twins, functions with one template, recursive twins,
//! adapters) flushed on 1, 2 and 4 threads gives the same object file,
//! byte for byte (cold, and warm from a code store), and the same JIT
//! results as plain `JITModule`; each
//! function is compiled once; failures (a verifier error, a Cranelift
//! panic) among them are reported as on one thread, and the others are
//! defined. `JITFOLD_STRESS=1` runs a longer stress test.

#![cfg(all(feature = "jit", feature = "object"))]

use crate::common;

use crate::common::build::{built, call1, emit_call};
use crate::common::eh_frame::{self, Fde};
use cranelift_codegen::ir::{
    self, AbiParam, InstBuilder, condcodes::IntCC, types::I32, types::I64,
};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleError, default_libcall_names};
use cranelift_object::object::read::elf::ElfFile64;
use cranelift_object::object::{self, Object as _, ObjectSection as _, ObjectSymbol as _};
use cranelift_object::{ObjectBuilder, ObjectModule};
use jitfold::store::CodeStore;
use jitfold::{DedupError, DedupModule, DedupOptions, Stats};
use std::collections::HashMap;
use std::sync::Arc;

/// What function `i` of the program is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `x * c + i`, distinct.
    Leaf,
    /// Twelve multiply-add steps with constants of its own (large enough
    /// for an adapter).
    Big,
    /// Calls a leaf and multiplies: one template for all of them, so all
    /// but the first reuse its code.
    Caller,
    /// An exact twin of the leaf three before (values renumbered).
    Twin,
    /// Calls the twin before it: a caller of a duplicate.
    CallsTwin,
    /// Two calls and a constant of its own.
    TwoCalls,
    /// Self-recursive, with a constant shared by pairs: recursive twins.
    Recursive,
    /// The big function six before, in the `tail` convention: an adapter.
    TailTwin,
    /// A loop with a constant of its own.
    Loop,
    /// Calls the next function (defined later) and subtracts `i`.
    Forward,
}

const KINDS: [Kind; 10] = [
    Kind::Leaf,
    Kind::Big,
    Kind::Caller,
    Kind::Twin,
    Kind::CallsTwin,
    Kind::TwoCalls,
    Kind::Recursive,
    Kind::TailTwin,
    Kind::Loop,
    Kind::Forward,
];

fn kind(i: usize) -> Kind {
    KINDS[i % KINDS.len()]
}

/// A function that fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bad {
    /// Adds an `i32` to an `i64`: the verifier rejects it.
    Mistyped,
    /// A `return_call` without `preserve_frame_pointers`: Cranelift panics
    /// at emission on x86-64.
    Panics,
}

/// The program's functions: `n` (a multiple of 10) functions, each
/// defined as its [`Kind`] says, except those in `bad` (only `Loop`
/// functions, which nothing calls), defined to fail, and those in `skip`,
/// left undefined. `between` runs after every `flush_every` functions
/// (half of them unless changed), to flush.
struct Program {
    n: usize,
    bad: Vec<(usize, Bad)>,
    skip: Vec<usize>,
    flush_every: usize,
}

impl Program {
    fn new(n: usize) -> Self {
        assert_eq!(n % 10, 0);
        Self {
            n,
            bad: Vec::new(),
            skip: Vec::new(),
            flush_every: n / 2,
        }
    }

    fn bad_at(&self, i: usize) -> Option<Bad> {
        self.bad.iter().find(|(j, _)| *j == i).map(|(_, b)| *b)
    }

    fn conv_of(&self, i: usize, default: CallConv) -> CallConv {
        if kind(i) == Kind::TailTwin || self.bad_at(i) == Some(Bad::Panics) {
            CallConv::Tail
        } else {
            default
        }
    }

    /// Declares and defines the program in `m`; returns every id.
    fn define<M: Module>(&self, m: &mut M, mut between: impl FnMut(&mut M)) -> Vec<FuncId> {
        let default = m.isa().default_call_conv();
        let ids: Vec<FuncId> = (0..self.n)
            .map(|i| {
                let mut sig = m.make_signature();
                sig.call_conv = self.conv_of(i, default);
                sig.params.push(AbiParam::new(I64));
                sig.returns.push(AbiParam::new(I64));
                m.declare_function(&format!("f{i}"), Linkage::Hidden, &sig)
                    .unwrap()
            })
            .collect();
        for i in 0..self.n {
            if i > 0 && i % self.flush_every == 0 {
                between(m);
            }
            if self.skip.contains(&i) {
                continue;
            }
            let func = self.build(m, &ids, i);
            let mut ctx = m.make_context();
            ctx.func = func;
            // Batch mode: failures show at the flush.
            m.define_function(ids[i], &mut ctx).unwrap();
        }
        ids
    }

    /// The body of function `i`.
    fn build<M: Module>(&self, m: &mut M, ids: &[FuncId], i: usize) -> ir::Function {
        let n = self.n;
        let id = ids[i];
        let leaf = |j: usize| j - j % 10;
        built(m, id, |b, m, p| {
            let x = p[0];
            let r = match (self.bad_at(i), kind(i)) {
                (Some(Bad::Mistyped), _) => {
                    let narrow = b.ins().iconst(I32, 1);
                    b.ins().iadd(x, narrow)
                }
                (Some(Bad::Panics), _) => {
                    // The tail twin before it has the same signature.
                    let callee = m.declare_func_in_func(ids[i - 1], b.func);
                    b.ins().return_call(callee, &[x]);
                    return;
                }
                (None, Kind::Leaf) => leaf_body(b, x, i),
                (None, Kind::Twin) => {
                    // Other value numbers than the leaf's.
                    let dead = b.ins().iconst(I64, 0);
                    let inst = b.func.dfg.value_def(dead).unwrap_inst();
                    b.func.layout.remove_inst(inst);
                    leaf_body(b, x, i - 3)
                }
                (None, Kind::Big) => big_body(b, x, i),
                (None, Kind::TailTwin) => big_body(b, x, i - 6),
                (None, Kind::Caller) => {
                    // Some leaves are defined later.
                    let y = emit_call(b, m, ids[leaf((i * 7 + 30) % n)], x);
                    b.ins().imul(y, x)
                }
                (None, Kind::CallsTwin) => {
                    let y = emit_call(b, m, ids[i - 1], x);
                    b.ins().imul(y, x)
                }
                (None, Kind::TwoCalls) => {
                    let y = emit_call(b, m, ids[leaf((i * 3) % n)], x);
                    let c = b.ins().iconst(I64, i as i64 * 11);
                    let x2 = b.ins().bxor(x, c);
                    let z = emit_call(b, m, ids[leaf((i * 5 + 10) % n)], x2);
                    b.ins().iadd(y, z)
                }
                (None, Kind::Recursive) => recursive_body(b, m, id, x, i / 20),
                (None, Kind::Loop) => loop_body(b, x, i),
                (None, Kind::Forward) => {
                    let y = emit_call(b, m, ids[(i + 1) % n], x);
                    b.ins().iadd_imm_s(y, -(i as i64))
                }
            };
            b.ins().return_(&[r]);
        })
    }

    /// The ids of the functions plain Cranelift can call from Rust
    /// (defined, not failing, in the default convention).
    fn callable(&self, ids: &[FuncId]) -> Vec<(usize, FuncId)> {
        (0..self.n)
            .filter(|&i| {
                kind(i) != Kind::TailTwin && self.bad_at(i).is_none() && !self.skip.contains(&i)
            })
            .map(|i| (i, ids[i]))
            .collect()
    }
}

fn leaf_body(b: &mut FunctionBuilder<'_>, x: ir::Value, i: usize) -> ir::Value {
    let t = b.ins().imul_imm_s(x, i as i64 * 7 + 3);
    b.ins().iadd_imm_s(t, i as i64)
}

fn big_body(b: &mut FunctionBuilder<'_>, x: ir::Value, i: usize) -> ir::Value {
    let mut a = x;
    for step in 1..=12 {
        let t = b.ins().imul(a, x);
        a = b.ins().iadd_imm_s(t, (i * 100 + step) as i64);
    }
    a
}

/// `r(x) = x <= 0 ? k : r(x - 1) + x`.
fn recursive_body<M: Module>(
    b: &mut FunctionBuilder<'_>,
    m: &mut M,
    own: FuncId,
    x: ir::Value,
    k: usize,
) -> ir::Value {
    let (base, step, join) = (b.create_block(), b.create_block(), b.create_block());
    b.append_block_param(join, I64);
    let positive = b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
    b.ins().brif(positive, step, &[], base, &[]);
    b.switch_to_block(base);
    let k = b.ins().iconst(I64, k as i64);
    b.ins().jump(join, &[k.into()]);
    b.switch_to_block(step);
    let less = b.ins().iadd_imm_s(x, -1);
    let r = emit_call(b, m, own, less);
    let sum = b.ins().iadd(r, x);
    b.ins().jump(join, &[sum.into()]);
    b.switch_to_block(join);
    b.block_params(join)[0]
}

/// `sum = 0; for j in 0..(x & 15) { sum += x * i + j }`.
fn loop_body(b: &mut FunctionBuilder<'_>, x: ir::Value, i: usize) -> ir::Value {
    let (head, body, exit) = (b.create_block(), b.create_block(), b.create_block());
    b.append_block_param(head, I64); // j
    b.append_block_param(head, I64); // sum
    b.append_block_param(exit, I64);
    let count = b.ins().band_imm_u(x, 15);
    let zero = b.ins().iconst(I64, 0);
    b.ins().jump(head, &[zero.into(), zero.into()]);
    b.switch_to_block(head);
    let (j, sum) = (b.block_params(head)[0], b.block_params(head)[1]);
    let more = b.ins().icmp(IntCC::SignedLessThan, j, count);
    b.ins().brif(more, body, &[], exit, &[sum.into()]);
    b.switch_to_block(body);
    let t = b.ins().imul_imm_s(x, i as i64 * 13 + 1);
    let t = b.ins().iadd(t, j);
    let sum = b.ins().iadd(sum, t);
    let j = b.ins().iadd_imm_s(j, 1);
    b.ins().jump(head, &[j.into(), sum.into()]);
    b.switch_to_block(exit);
    b.block_params(exit)[0]
}

fn batch(threads: usize) -> DedupOptions {
    DedupOptions::batch().with_threads(threads)
}

/// The host's ISA by architecture name, with default flags.
fn host_isa() -> OwnedTargetIsa {
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").unwrap();
    cranelift_codegen::isa::lookup_by_name(std::env::consts::ARCH)
        .unwrap()
        .finish(settings::Flags::new(flags))
        .unwrap()
}

fn object_module(unwind_info: bool) -> ObjectModule {
    let mut builder = ObjectBuilder::new(host_isa(), "parallel", default_libcall_names()).unwrap();
    builder.unwind_info(unwind_info);
    ObjectModule::new(builder)
}

/// What a flush returned, by flush.
type Flushes = Vec<Result<(), String>>;

/// `program` in a `DedupModule<ObjectModule>` with `options`, flushed
/// halfway and at the end: the emitted object, the stats, the flushes'
/// results (errors as text) and the failed definitions left.
fn object_run(
    program: &Program,
    options: DedupOptions,
    unwind_info: bool,
) -> (Vec<u8>, Stats, Flushes, Vec<(FuncId, String)>) {
    object_run_on(program, options, unwind_info, None)
}

/// [`object_run`] with a code store, if any.
fn object_run_on(
    program: &Program,
    options: DedupOptions,
    unwind_info: bool,
    store: Option<Arc<dyn CodeStore>>,
) -> (Vec<u8>, Stats, Flushes, Vec<(FuncId, String)>) {
    let mut d = DedupModule::wrap(object_module(unwind_info), options);
    if let Some(store) = store {
        d = d.with_store(store, None);
    }
    let mut flushes = Vec::new();
    program.define(&mut d, |d| {
        flushes.push(d.flush().map_err(|e| error_text(&e)))
    });
    flushes.push(d.flush().map_err(|e| error_text(&e)));
    let failed = d.take_failed_definitions();
    // Entries are written behind the flushes: all counted once written.
    d.wait_for_store_writes();
    let stats = d.stats().clone();
    let bytes = d.try_finish().unwrap().emit().unwrap();
    (bytes, stats, flushes, failed)
}

fn error_text(e: &ModuleError) -> String {
    match DedupError::of(e) {
        Some(d) => format!("{d:?}"),
        None => format!("{e:?}"),
    }
}

/// The counters that must not depend on the number of threads.
fn outcome_counts(s: &Stats) -> [u64; 9] {
    [
        s.defined,
        s.compiled,
        s.reused,
        s.adapted,
        s.aliased,
        s.trampolined,
        s.code_bytes,
        s.trampoline_bytes,
        s.code_bytes_without_dedup,
    ]
}

/// Every function was compiled once: the parallel phases compiled what
/// was compiled, except the module's first compile (the inner module's),
/// and nothing was thrown away.
fn assert_compiled_once(s: &Stats, threads: usize, context: &str) {
    assert_eq!(s.parallel_discarded, 0, "{context}: {s:?}");
    let parallel: u64 = s.compiles_per_thread.iter().sum();
    assert_eq!(parallel + 1, s.compiled, "{context}: {s:?}");
    assert_eq!(s.compiles_per_thread.len(), threads, "{context}: {s:?}");
}

/// The object files of the program flushed on 1, 2 and 4 threads are the
/// same bytes (code, symbols, relocations, everything), and each of the
/// parallel runs compiled every function once.
#[test]
fn object_files_are_identical_on_any_number_of_threads() {
    let program = Program::new(400);
    let (serial, serial_stats, flushes, _) = object_run(&program, batch(1), false);
    assert!(flushes.iter().all(Result::is_ok), "{flushes:?}");
    assert!(serial_stats.compiles_per_thread.is_empty());
    // The workload has every kind of outcome.
    let s = &serial_stats;
    assert!(s.compiled > 100 && s.reused > 20 && s.adapted > 20, "{s:?}");
    assert!(s.trampolined > 20, "{s:?}");
    for threads in [2, 4] {
        let (bytes, stats, flushes, _) = object_run(&program, batch(threads), false);
        assert!(flushes.iter().all(Result::is_ok), "{flushes:?}");
        assert_eq!(outcome_counts(&stats), outcome_counts(&serial_stats));
        assert_compiled_once(&stats, threads, &format!("{threads} threads"));
        assert!(
            bytes == serial,
            "{threads} threads: the object differs from one thread's ({}: {:?})",
            bytes.len(),
            first_difference(&bytes, &serial)
        );
    }
}

/// A warm start from a code store gives the same object file on 1, 2 and
/// 4 threads, byte for byte, where the threads walk the functions and
/// check the entries a flush fetched ahead of each function's turn; the
/// same functions are loaded, and nothing is compiled. (Entries serve an
/// object module only with their unwind information: `store-unwind`.)
#[test]
#[cfg(feature = "store-unwind")]
fn warm_starts_give_identical_objects_on_any_number_of_threads() {
    use jitfold::store::MemoryStore;
    let program = Program::new(400);
    let store: Arc<dyn CodeStore> = Arc::new(MemoryStore::new());
    let (_, cold, flushes, _) = object_run_on(&program, batch(1), true, Some(store.clone()));
    assert!(flushes.iter().all(Result::is_ok), "{flushes:?}");
    assert!(cold.store_writes > 100, "{cold:?}");
    let warm = |threads| object_run_on(&program, batch(threads), true, Some(store.clone()));
    let (serial, serial_stats, flushes, _) = warm(1);
    assert!(flushes.iter().all(Result::is_ok), "{flushes:?}");
    assert_eq!(
        (serial_stats.loaded, serial_stats.compiled),
        (cold.store_writes, 0),
        "{serial_stats:?}"
    );
    let loads = |s: &Stats| {
        [
            s.loaded,
            s.store_rejected,
            s.verified_by_equality,
            s.compiled,
        ]
    };
    for threads in [2, 4] {
        let (bytes, stats, flushes, _) = warm(threads);
        assert!(flushes.iter().all(Result::is_ok), "{flushes:?}");
        assert_eq!(outcome_counts(&stats), outcome_counts(&serial_stats));
        assert_eq!(loads(&stats), loads(&serial_stats), "{threads} threads");
        assert!(
            bytes == serial,
            "{threads} threads: the object differs from one thread's ({}: {:?})",
            bytes.len(),
            first_difference(&bytes, &serial)
        );
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// With distinct addresses off (duplicates share addresses, symbols are
/// moved) and with check mode on, the same.
#[test]
fn other_options_give_identical_objects_too() {
    let program = Program::new(200);
    for options in [
        batch(1).with_distinct_addresses(false),
        batch(1).with_check(true),
        batch(1).with_reuse(false),
    ] {
        let (serial, serial_stats, _, _) = object_run(&program, options, false);
        let (bytes, stats, flushes, _) = object_run(&program, options.with_threads(3), false);
        assert!(flushes.iter().all(Result::is_ok), "{options}: {flushes:?}");
        assert_eq!(outcome_counts(&stats), outcome_counts(&serial_stats));
        assert_compiled_once(&stats, 3, &options.to_string());
        assert!(bytes == serial, "{options}: objects differ");
    }
}

/// The text section, each text symbol's (offset, size) by name, the text
/// relocations, and each function's FDE instructions, of an ELF object.
struct Read {
    text: Vec<u8>,
    symbols: HashMap<String, (u64, u64)>,
    relocations: Vec<String>,
    fdes: HashMap<String, Vec<String>>,
}

fn read(bytes: &[u8]) -> Read {
    let file = ElfFile64::<object::Endianness>::parse(bytes).unwrap();
    let text = file.section_by_name(".text").unwrap();
    let symbols: HashMap<String, (u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text)
        .map(|s| (s.name().unwrap().to_string(), (s.address(), s.size())))
        .collect();
    let relocations = text
        .relocations()
        .map(|(offset, r)| format!("{offset:#x} {r:?}"))
        .collect();
    let fdes = eh_frame::fdes(&file)
        .into_iter()
        .flat_map(
            |Fde {
                 start,
                 len,
                 instructions,
             }| {
                symbols
                    .iter()
                    .filter(move |(_, (address, _))| start <= *address && *address < start + len)
                    .map(move |(name, _)| (name.clone(), instructions.clone()))
            },
        )
        .collect::<Vec<_>>();
    let mut by_name: HashMap<String, Vec<String>> = HashMap::new();
    for (name, instructions) in fdes {
        assert!(
            by_name.insert(name.clone(), instructions).is_none(),
            "{name} is covered by two FDEs"
        );
    }
    Read {
        text: text.data().unwrap().to_vec(),
        symbols,
        relocations,
        fdes: by_name,
    }
}

/// With unwind information, the code, symbols and relocations are the
/// same, and every function is covered by one FDE with the same
/// instructions as on one thread (the FDEs are laid out differently: see
/// `unwind.rs`).
#[test]
fn object_files_with_unwind_information_describe_every_function_the_same() {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        return;
    }
    let program = Program::new(200);
    let (serial, ..) = object_run(&program, batch(1), true);
    let serial = read(&serial);
    assert_eq!(
        serial.fdes.len(),
        program.n,
        "one thread covers every function"
    );
    let (bytes, stats, ..) = object_run(&program, batch(2), true);
    assert_compiled_once(&stats, 2, "unwind");
    let parallel = read(&bytes);
    assert!(parallel.text == serial.text, "the code differs");
    assert_eq!(parallel.symbols, serial.symbols);
    assert_eq!(parallel.relocations, serial.relocations);
    assert_eq!(parallel.fdes, serial.fdes);
}

/// A batch of distinct functions only, nothing the inner module would
/// compile but them, so that jitfold has no frames to write but theirs:
/// with unwind information, each is still covered by an FDE on two threads
/// (the inner module's first compile shows that frame descriptions were
/// asked for); without, the object is the one-thread object.
#[test]
fn distinct_functions_alone_get_their_frame_descriptions() {
    let run = |threads: usize, unwind_info: bool| {
        let mut d = DedupModule::wrap(object_module(unwind_info), batch(threads));
        let conv = d.isa().default_call_conv();
        for i in 0..30 {
            let id = common::build::declare(&mut d, &format!("g{i}"), conv);
            common::build::define(&mut d, id, |b, _, p| {
                let r = big_body(b, p[0], i);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        d.flush().unwrap();
        assert_eq!(d.stats().compiled, 30);
        if threads > 1 {
            assert_compiled_once(d.stats(), threads, "distinct");
        }
        d.finish().emit().unwrap()
    };
    assert!(run(2, false) == run(1, false), "objects differ");
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        for threads in [1, 2] {
            let read = read(&run(threads, true));
            assert_eq!(read.fdes.len(), 30, "{threads} threads");
            assert!(read.fdes.values().all(|i| !i.is_empty()));
        }
    }
}

/// `program` in a JIT module (`jit` makes it, `flush` flushes it halfway
/// and finalizes at the end): every callable function's results on a few
/// inputs.
fn jit_results<M: Module>(
    program: &Program,
    m: &mut M,
    mut flush: impl FnMut(&mut M, bool),
    pointer: impl Fn(&M, FuncId) -> *const u8,
) -> Vec<(usize, Vec<i64>)> {
    let ids = program.define(m, |m| flush(m, false));
    flush(m, true);
    program
        .callable(&ids)
        .into_iter()
        .map(|(i, id)| {
            let p = pointer(m, id);
            (i, [-3, 0, 1, 7, 40].map(|x| call1(p, x)).to_vec())
        })
        .collect()
}

fn plain_results(program: &Program) -> Vec<(usize, Vec<i64>)> {
    let mut plain = JITModule::new(JITBuilder::new(default_libcall_names()).unwrap());
    jit_results(
        program,
        &mut plain,
        |m, last| {
            if last {
                m.finalize_definitions().unwrap();
            }
        },
        |m, id| m.get_finalized_function(id),
    )
}

/// Results of `program` in a `DedupModule<JITModule>` with `options`, with
/// its stats and the flushes' errors.
fn dedup_results(
    program: &Program,
    options: DedupOptions,
) -> (Vec<(usize, Vec<i64>)>, Stats, Flushes) {
    let jit = JITModule::new(JITBuilder::new(default_libcall_names()).unwrap());
    let mut d = DedupModule::wrap(jit, options);
    let mut flushes = Vec::new();
    let results = jit_results(
        program,
        &mut d,
        |d, last| {
            flushes.push(d.flush().map_err(|e| error_text(&e)));
            if last {
                d.take_failed_definitions();
                d.finalize_definitions().unwrap();
            }
        },
        |d, id| d.get_finalized_function(id),
    );
    (results, d.stats().clone(), flushes)
}

/// In the JIT, every function returns what it returns in plain
/// `JITModule`, on 1, 2 and 4 threads, and the outcomes do not depend on
/// the number of threads.
#[test]
fn jit_functions_return_what_plain_jit_returns() {
    let program = Program::new(300);
    let expected = plain_results(&program);
    let (_, serial_stats, _) = dedup_results(&program, batch(1));
    for threads in [1, 2, 4] {
        let (results, stats, flushes) = dedup_results(&program, batch(threads));
        assert!(flushes.iter().all(Result::is_ok), "{flushes:?}");
        assert_eq!(results, expected, "{threads} threads");
        assert_eq!(outcome_counts(&stats), outcome_counts(&serial_stats));
        if threads > 1 {
            assert_compiled_once(&stats, threads, &format!("{threads} threads"));
        }
    }
}

/// A function that fails to verify and one that makes Cranelift panic,
/// among many, in each half: the flushes fail as on one thread (same
/// functions, same errors, in definition order), and every other function
/// is defined and returns what it returns in plain `JITModule`.
#[test]
fn failures_among_many_are_reported_as_on_one_thread() {
    let mut program = Program::new(200);
    // `Loop` functions, which nothing calls: 8, 18, ...
    program.bad = vec![(48, Bad::Mistyped), (118, Bad::Mistyped)];
    if cfg!(target_arch = "x86_64") {
        program.bad.extend([(58, Bad::Panics), (178, Bad::Panics)]);
    }
    let mut plain = Program::new(program.n);
    plain.skip = program.bad.iter().map(|(i, _)| *i).collect();
    let expected: Vec<_> = plain_results(&plain);

    let (_, serial_stats, serial_flushes) = dedup_results(&program, batch(1));
    assert!(
        serial_flushes.iter().all(Result::is_err),
        "{serial_flushes:?}"
    );
    if cfg!(target_arch = "x86_64") {
        let first = serial_flushes[0].as_ref().unwrap_err();
        assert!(
            first.contains("f48: ") && first.contains("f58: "),
            "{first}"
        );
        assert!(
            first.contains("Verifier") || first.contains("verifier"),
            "{first}"
        );
        assert!(first.contains("panic"), "{first}");
    }
    for threads in [2, 4] {
        let (results, stats, flushes) = dedup_results(&program, batch(threads));
        assert_eq!(flushes, serial_flushes, "{threads} threads");
        assert_eq!(results, expected, "{threads} threads");
        assert_eq!(outcome_counts(&stats), outcome_counts(&serial_stats));
        assert_eq!(stats.parallel_discarded, 0);
        // The failed ones were compiled in parallel, and are not counted
        // as compiled.
        let parallel: u64 = stats.compiles_per_thread.iter().sum();
        assert_eq!(parallel + 1, stats.compiled + program.bad.len() as u64);
    }
}

/// One failure alone is its own error, as on one thread: a Cranelift
/// panic on a thread is `CraneliftPanic` naming the function.
#[test]
fn a_panic_on_a_thread_is_that_functions_cranelift_panic() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let mut program = Program::new(100);
    program.bad = vec![(28, Bad::Panics)];
    for threads in [1, 2] {
        let jit = JITModule::new(JITBuilder::new(default_libcall_names()).unwrap());
        let mut d = DedupModule::wrap(jit, batch(threads));
        let mut first = None;
        program.define(&mut d, |d| first = Some(d.flush()));
        let e = first.unwrap().unwrap_err();
        assert!(
            matches!(DedupError::of(&e), Some(DedupError::CraneliftPanic { function, .. }) if function == "f28"),
            "{threads} threads: {e:?}"
        );
        d.flush().unwrap_err(); // still listed until given up
        assert_eq!(d.take_failed_definitions().len(), 1);
        d.finalize_definitions().unwrap();
        if threads > 1 {
            let s = d.stats();
            let parallel: u64 = s.compiles_per_thread.iter().sum();
            assert_eq!(parallel + 1, s.compiled + 1, "{s:?}");
        }
    }
}

#[test]
fn threads_show_in_the_options_name() {
    assert_eq!(DedupOptions::batch().to_string(), "batch, distinct");
    assert_eq!(
        DedupOptions::batch().with_threads(1).to_string(),
        "batch, distinct"
    );
    assert_eq!(
        DedupOptions::batch().with_threads(4).to_string(),
        "batch, distinct, 4 threads"
    );
    assert_eq!(DedupOptions::default().threads, 1);
}

/// Eager mode ignores the thread count.
#[test]
fn eager_mode_compiles_on_the_callers_thread() {
    let program = Program::new(100);
    let (_, serial, _) = dedup_results(&program, DedupOptions::eager());
    let (_, stats, _) = dedup_results(&program, DedupOptions::eager().with_threads(4));
    assert!(stats.compiles_per_thread.is_empty());
    assert_eq!(outcome_counts(&stats), outcome_counts(&serial));
}

/// Batches in many flushes (later ones finding earlier classes and
/// templates) and in two, on up to 8 threads: objects identical to one
/// thread's, each function compiled once. Short under `cargo test`; set
/// `JITFOLD_STRESS` for a longer run.
#[test]
fn stress() {
    let long = std::env::var_os("JITFOLD_STRESS").is_some();
    let sizes: &[usize] = if long { &[1000, 3000, 6000] } else { &[600] };
    let threads: &[usize] = if long { &[2, 3, 5, 8] } else { &[2, 8] };
    // Parts that divide every size: no flush of one function (which
    // compiles on the flushing thread, and the count would differ).
    for (&n, parts) in sizes.iter().flat_map(|n| [(n, 2), (n, 5)]) {
        let mut program = Program::new(n);
        program.flush_every = n / parts;
        let (serial, serial_stats, _, _) = object_run(&program, batch(1), false);
        for &t in threads {
            let (bytes, stats, flushes, _) = object_run(&program, batch(t), false);
            assert!(flushes.iter().all(Result::is_ok), "{flushes:?}");
            assert_eq!(outcome_counts(&stats), outcome_counts(&serial_stats));
            assert_compiled_once(&stats, t, &format!("{n} functions, {t} threads"));
            assert!(
                bytes == serial,
                "{n} functions, {t} threads: objects differ"
            );
        }
    }
}

/// On an ISA without a machine-code trampoline (riscv64), batch planning
/// makes no duplicates: a `tail` twin becomes one only in its turn (a
/// `return_call` to its twin), and a caller compiled on a thread before
/// that still calls the twin. Its turn rewrites the call, so that code is
/// not used (counted as discarded) and the caller is compiled and cached
/// as on one thread: the objects are the same, and so is what a later
/// function equal to the rewritten caller finds.
#[cfg(feature = "all-targets")]
#[test]
fn code_compiled_before_a_reference_is_rewritten_is_not_used() {
    use common::build::{declare, define};
    let run = |threads: usize| {
        let isa = cranelift_codegen::isa::lookup_by_name("riscv64")
            .unwrap()
            .finish(settings::Flags::new(settings::builder()))
            .unwrap();
        let builder = ObjectBuilder::new(isa, "riscv", default_libcall_names()).unwrap();
        let mut d = DedupModule::wrap(ObjectModule::new(builder), batch(threads));
        let [first, a, b, caller, other] =
            ["first", "a", "b", "caller", "other"].map(|n| declare(&mut d, n, CallConv::Tail));
        for (id, k) in [(first, 1), (a, 5), (b, 5), (other, 9)] {
            define(&mut d, id, |b, _, p| {
                let r = leaf_body(b, p[0], k);
                b.ins().return_(&[r]);
            })
            .unwrap();
        }
        define(&mut d, caller, |bd, m, p| {
            let y = emit_call(bd, m, b, p[0]);
            let r = bd.ins().imul(y, p[0]);
            bd.ins().return_(&[r]);
        })
        .unwrap();
        d.flush().unwrap();
        assert_eq!(d.canonical(b), Some(a));
        // The caller as it was defined, calling `a`: the cache holds the
        // caller under that key, not the key of the walk made before the
        // rewrite (calling `b`), so this one is found there, as on one
        // thread.
        let again = declare(&mut d, "again", CallConv::Tail);
        define(&mut d, again, |bd, m, p| {
            let y = emit_call(bd, m, a, p[0]);
            let r = bd.ins().imul(y, p[0]);
            bd.ins().return_(&[r]);
        })
        .unwrap();
        d.flush().unwrap();
        let stats = d.stats().clone();
        (d.finish().emit().unwrap(), stats)
    };
    let (serial, serial_stats) = run(1);
    let (bytes, stats) = run(2);
    assert_eq!(outcome_counts(&stats), outcome_counts(&serial_stats));
    assert_eq!(stats.parallel_discarded, 1, "{stats:?}");
    assert!(bytes == serial, "objects differ");
}

/// `Stats::compiles_per_thread` is empty when no flush compiled in
/// parallel: a flush on two threads that queues nothing (its only function
/// is the module's first compile, left to the inner module) starts no
/// thread and counts nothing.
#[test]
fn a_flush_that_compiles_nothing_in_parallel_leaves_per_thread_empty() {
    use common::build::{declare, define};
    let mut d = DedupModule::wrap(object_module(false), batch(2));
    let f = declare(&mut d, "only", CallConv::SystemV);
    define(&mut d, f, |b, _, p| {
        let r = leaf_body(b, p[0], 1);
        b.ins().return_(&[r]);
    })
    .unwrap();
    d.flush().unwrap();
    let stats = d.stats().clone();
    assert_eq!(stats.compiled, 1, "{stats:?}");
    assert!(stats.compiles_per_thread.is_empty(), "{stats:?}");
}
