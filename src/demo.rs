//! The built-in workload of `jitfold demo`: what a JIT for a small typed
//! language emits when it monomorphizes a generic standard library for many
//! types, across several separately generated units, plus per-call-site
//! stubs.
//!
//! # What this module guarantees
//!
//! - [`build`] declares and defines the same functions, in the same order,
//!   on any `Module`, so a plain `JITModule` and a `DedupModule` get the same
//!   program.
//! - Every function has the signature `(i64, i64) -> i64` in the ISA's
//!   default calling convention and terminates for every input (loops and
//!   recursion are bounded), so [`run`] can call each one on fixed inputs.
//!
//! Where duplicates come from, as in real JITs: instantiations for types that
//! lower to the same machine type (`i64`, `isize`, pointers; `u64`, `usize`)
//! are identical; signed and unsigned instantiations differ only where
//! signedness matters (comparison, division, widening); every unit
//! instantiates the library again; per-call-site stubs into the runtime are
//! identical. And one generic, `hash`, is salted with a constant of its
//! type (a type id, as runtimes salt per-type hashers): its instantiations
//! for one machine type differ only in those constants, which is what
//! similar-function merging ([`crate::similar`]) merges.

use cranelift_codegen::ir::{self, AbiParam, InstBuilder, condcodes::IntCC, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{FuncId, Linkage, Module, ModuleResult};

/// A source-language type the generic library is instantiated for.
#[derive(Clone, Copy, Debug)]
struct LangType {
    name: &'static str,
    clif: ir::Type,
    signed: bool,
}

const TYPES: [LangType; 9] = [
    LangType {
        name: "i64",
        clif: types::I64,
        signed: true,
    },
    LangType {
        name: "isize",
        clif: types::I64,
        signed: true,
    },
    LangType {
        name: "u64",
        clif: types::I64,
        signed: false,
    },
    LangType {
        name: "usize",
        clif: types::I64,
        signed: false,
    },
    LangType {
        name: "ptr_node",
        clif: types::I64,
        signed: false,
    },
    LangType {
        name: "ptr_str",
        clif: types::I64,
        signed: false,
    },
    LangType {
        name: "i32",
        clif: types::I32,
        signed: true,
    },
    LangType {
        name: "u32",
        clif: types::I32,
        signed: false,
    },
    LangType {
        name: "char",
        clif: types::I32,
        signed: false,
    },
];

/// Name of the runtime function the call-site stubs call; the JIT must
/// resolve it to [`runtime_dispatch`].
pub const RUNTIME_DISPATCH: &str = "jitfold_demo_dispatch";

/// The runtime entry point that per-call-site stubs call.
pub extern "C" fn runtime_dispatch(receiver: i64, selector: i64) -> i64 {
    receiver.wrapping_mul(31).wrapping_add(selector) ^ 0x5a5a
}

/// The functions of the workload, in definition order, with their names.
pub struct Workload {
    /// Every defined function.
    pub functions: Vec<(String, FuncId)>,
    /// Machine-code bytes the module left in `ctx.compiled_code()` after
    /// each definition (all of them for a plain module; only what was
    /// actually compiled for a `DedupModule`).
    pub compiled_code_bytes: u64,
}

/// Inputs every function is called with.
pub const INPUTS: [(i64, i64); 6] = [(0, 0), (1, 2), (-7, 3), (40, -5), (i64::MAX, 2), (12345, 0)];

/// Declares and defines the workload on `m`: `units` copies of the generic
/// library instantiated for every type, and `stubs` call-site stubs.
pub fn build<M: Module>(m: &mut M, units: usize, stubs: usize) -> ModuleResult<Workload> {
    let mut sig = m.make_signature();
    sig.params.push(AbiParam::new(types::I64));
    sig.params.push(AbiParam::new(types::I64));
    sig.returns.push(AbiParam::new(types::I64));
    let dispatch = m.declare_function(RUNTIME_DISPATCH, Linkage::Import, &sig)?;
    let mut functions = Vec::new();
    let mut compiled_code_bytes = 0;
    let mut fctx = FunctionBuilderContext::new();
    for unit in 0..units {
        for (type_index, ty) in TYPES.into_iter().enumerate() {
            let declare = |m: &mut M, generic: &str| -> ModuleResult<(String, FuncId)> {
                let name = format!("unit{unit}::{generic}<{}>", ty.name);
                Ok((
                    name.clone(),
                    m.declare_function(&name, Linkage::Local, &sig)?,
                ))
            };
            let square = declare(m, "square")?;
            let sum_sq = declare(m, "sum_of_squares")?;
            let max = declare(m, "max")?;
            let div = declare(m, "checked_div")?;
            let sum_to = declare(m, "sum_to")?;
            let fib = declare(m, "fib")?;
            let hash = declare(m, "hash")?;
            let defs: [(&(String, FuncId), Body); 7] = [
                (&square, Body::Square),
                (&sum_sq, Body::SumOfSquares(square.1)),
                (&max, Body::Max),
                (&div, Body::Div),
                (&sum_to, Body::SumTo),
                (&fib, Body::Fib(fib.1)),
                (&hash, Body::Hash(type_seed(type_index))),
            ];
            for ((name, id), body) in defs {
                compiled_code_bytes += define(m, &mut fctx, *id, ty, body)?;
                functions.push((name.clone(), *id));
            }
        }
    }
    let int = TYPES[0];
    for site in 0..stubs {
        let name = format!("stub::call_site{site}");
        let id = m.declare_function(&name, Linkage::Local, &sig)?;
        compiled_code_bytes += define(m, &mut fctx, id, int, Body::Stub(dispatch))?;
        functions.push((name, id));
    }
    Ok(Workload {
        functions,
        compiled_code_bytes,
    })
}

/// What a generic function does.
#[derive(Clone, Copy)]
enum Body {
    Square,
    SumOfSquares(FuncId),
    Max,
    Div,
    SumTo,
    Fib(FuncId),
    /// Salted with this per-type constant.
    Hash(i64),
    Stub(FuncId),
}

/// The salt of the `hash` instantiation for `TYPES[index]`.
fn type_seed(index: usize) -> i64 {
    (0xcbf2_9ce4_8422_2325_u64 ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) as i64
}

fn define<M: Module>(
    m: &mut M,
    fctx: &mut FunctionBuilderContext,
    id: FuncId,
    ty: LangType,
    body: Body,
) -> ModuleResult<u64> {
    let mut ctx = m.make_context();
    ctx.func.signature = m.declarations().get_function_decl(id).signature.clone();
    let mut b = FunctionBuilder::new(&mut ctx.func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let (a0, a1) = (b.block_params(entry)[0], b.block_params(entry)[1]);
    // Arguments arrive as i64 and are narrowed to the instantiated type.
    let narrow = |b: &mut FunctionBuilder, v| {
        if ty.clif == types::I64 {
            v
        } else {
            b.ins().ireduce(ty.clif, v)
        }
    };
    let widen = |b: &mut FunctionBuilder, v| {
        if ty.clif == types::I64 {
            v
        } else if ty.signed {
            b.ins().sextend(types::I64, v)
        } else {
            b.ins().uextend(types::I64, v)
        }
    };
    let call = |b: &mut FunctionBuilder, m: &mut M, callee: FuncId, args: &[ir::Value]| {
        let callee = m.declare_func_in_func(callee, b.func);
        let call = b.ins().call(callee, args);
        b.inst_results(call)[0]
    };
    let result = match body {
        Body::Square => {
            let x = narrow(&mut b, a0);
            let sq = b.ins().imul(x, x);
            widen(&mut b, sq)
        }
        Body::SumOfSquares(square) => {
            let x = call(&mut b, m, square, &[a0, a0]);
            let y = call(&mut b, m, square, &[a1, a1]);
            let (x, y) = (narrow(&mut b, x), narrow(&mut b, y));
            let s = b.ins().iadd(x, y);
            widen(&mut b, s)
        }
        Body::Max => {
            let (x, y) = (narrow(&mut b, a0), narrow(&mut b, a1));
            let cc = if ty.signed {
                IntCC::SignedGreaterThan
            } else {
                IntCC::UnsignedGreaterThan
            };
            let gt = b.ins().icmp(cc, x, y);
            let r = b.ins().select(gt, x, y);
            widen(&mut b, r)
        }
        Body::Div => {
            // Division by zero gives 0, and MIN / -1 gives MIN (wrapping).
            let (x, y) = (narrow(&mut b, a0), narrow(&mut b, a1));
            let zero_block = b.create_block();
            let div_block = b.create_block();
            let done = b.create_block();
            b.append_block_param(done, ty.clif);
            b.ins().brif(y, div_block, &[], zero_block, &[]);
            b.switch_to_block(zero_block);
            let zero = b.ins().iconst(ty.clif, 0);
            b.ins().jump(done, &[zero.into()]);
            b.switch_to_block(div_block);
            let q = if ty.signed {
                let minus_one = b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let one = b.ins().iconst(ty.clif, 1);
                let safe_y = b.ins().select(minus_one, one, y);
                let q = b.ins().sdiv(x, safe_y);
                let neg = b.ins().ineg(x);
                b.ins().select(minus_one, neg, q)
            } else {
                b.ins().udiv(x, y)
            };
            b.ins().jump(done, &[q.into()]);
            b.switch_to_block(done);
            let r = b.block_params(done)[0];
            widen(&mut b, r)
        }
        Body::SumTo => {
            // sum of i * step for i in 0..(n & 255)
            let n = b.ins().band_imm_u(a0, 255);
            let (x, step) = (narrow(&mut b, n), narrow(&mut b, a1));
            let head = b.create_block();
            let body = b.create_block();
            let exit = b.create_block();
            b.append_block_param(head, ty.clif);
            b.append_block_param(head, ty.clif);
            let zero = b.ins().iconst(ty.clif, 0);
            b.ins().jump(head, &[x.into(), zero.into()]);
            b.switch_to_block(head);
            let (i, acc) = (b.block_params(head)[0], b.block_params(head)[1]);
            b.ins().brif(i, body, &[], exit, &[]);
            b.switch_to_block(body);
            let term = b.ins().imul(i, step);
            let acc2 = b.ins().iadd(acc, term);
            let i2 = b.ins().iadd_imm_s(i, -1);
            b.ins().jump(head, &[i2.into(), acc2.into()]);
            b.switch_to_block(exit);
            widen(&mut b, acc)
        }
        Body::Fib(itself) => {
            // fib(n & 15), recursively.
            let n = b.ins().band_imm_u(a0, 15);
            let small = b.ins().icmp_imm_u(IntCC::UnsignedLessThan, n, 2);
            let rec = b.create_block();
            let done = b.create_block();
            b.append_block_param(done, types::I64);
            b.ins().brif(small, done, &[n.into()], rec, &[]);
            b.switch_to_block(rec);
            let n1 = b.ins().iadd_imm_s(n, -1);
            let n2 = b.ins().iadd_imm_s(n, -2);
            let f1 = call(&mut b, m, itself, &[n1, a1]);
            let f2 = call(&mut b, m, itself, &[n2, a1]);
            let (f1, f2) = (narrow(&mut b, f1), narrow(&mut b, f2));
            let s = b.ins().iadd(f1, f2);
            let s = widen(&mut b, s);
            b.ins().jump(done, &[s.into()]);
            b.switch_to_block(done);
            b.block_params(done)[0]
        }
        Body::Hash(seed) => {
            // Four rounds of xor, multiply and add over both arguments,
            // seeded and salted with the type's constant.
            let bits = ty.clif.bits();
            let fit = |v: i64| {
                if bits < 64 {
                    v & ((1i64 << bits) - 1)
                } else {
                    v
                }
            };
            let (x, y) = (narrow(&mut b, a0), narrow(&mut b, a1));
            let mut h = b.ins().iconst(ty.clif, fit(seed));
            for v in [x, y, x, y] {
                h = b.ins().bxor(h, v);
                let prime = b.ins().iconst(ty.clif, fit(0x0100_0000_01b3));
                h = b.ins().imul(h, prime);
                let salt = b.ins().iconst(ty.clif, fit(seed.rotate_left(17)));
                h = b.ins().iadd(h, salt);
            }
            widen(&mut b, h)
        }
        Body::Stub(dispatch) => {
            let r = call(&mut b, m, dispatch, &[a0, a1]);
            b.ins().iadd_imm_s(r, 1)
        }
    };
    b.ins().return_(&[result]);
    b.seal_all_blocks();
    b.finalize(m.target_config());
    m.define_function(id, &mut ctx)?;
    Ok(ctx
        .compiled_code()
        .map_or(0, |c| u64::from(c.code_info().total_size)))
}

/// Calls every function of `workload` on every [`INPUTS`] pair through the
/// code pointer `get` returns, and collects the results in order.
///
/// # Safety
///
/// `get` must return finalized code of the workload's functions, compiled
/// for the host, with `RUNTIME_DISPATCH` resolved to [`runtime_dispatch`].
pub unsafe fn run(workload: &Workload, get: impl Fn(FuncId) -> *const u8) -> Vec<i64> {
    let mut out = Vec::with_capacity(workload.functions.len() * INPUTS.len());
    for &(_, id) in &workload.functions {
        // SAFETY: per this function's contract, the pointer is finalized code
        // with the workload's signature `(i64, i64) -> i64` in the host's
        // default calling convention.
        let f: extern "C" fn(i64, i64) -> i64 = unsafe { core::mem::transmute(get(id)) };
        for (a, b) in INPUTS {
            out.push(f(a, b));
        }
    }
    out
}

/// One compilation of the workload: counts, sizes and time.
#[derive(Clone, Debug)]
pub struct Run {
    /// What was measured ("plain JITModule", "jitfold eager", ...).
    pub label: String,
    /// Functions defined.
    pub functions: usize,
    /// Functions compiled.
    pub compiled: u64,
    /// Functions defined from the code of another with the same template.
    pub reused: u64,
    /// Functions defined from entries of a code store.
    pub loaded: u64,
    /// Duplicates sharing an entry point.
    pub aliased: u64,
    /// Duplicates with a distinct address (trampoline).
    pub trampolined: u64,
    /// Functions turned into thunks of a merged body (similar-function
    /// merging).
    pub similar_merged: u64,
    /// Machine-code bytes emitted, trampolines included.
    pub code_bytes: u64,
    /// Time from the first definition to finalized code.
    pub time: std::time::Duration,
    /// The results of [`run`].
    pub results: Vec<i64>,
}

/// A `JITBuilder` for the host with `opt_level=speed` and
/// [`RUNTIME_DISPATCH`] resolved to [`runtime_dispatch`]: what [`build`]'s
/// functions need to run.
pub fn jit_builder() -> ModuleResult<cranelift_jit::JITBuilder> {
    let mut b = cranelift_jit::JITBuilder::with_flags(
        &[("opt_level", "speed")],
        cranelift_module::default_libcall_names(),
    )?;
    b.symbol(RUNTIME_DISPATCH, runtime_dispatch as *const u8);
    Ok(b)
}

/// Builds the workload with a plain `JITModule` and through `DedupModule` in
/// each of `options`, runs every function under each, and returns the runs
/// (plain first). Results are compared by the caller.
pub fn compare(
    units: usize,
    stubs: usize,
    options: &[crate::DedupOptions],
) -> ModuleResult<Vec<Run>> {
    compare_with_store(units, stubs, options, None, None)
}

/// [`compare`], with every `DedupModule` looking functions up in `store`
/// (and storing what it compiles) first, entries signed with `secret`.
pub fn compare_with_store(
    units: usize,
    stubs: usize,
    options: &[crate::DedupOptions],
    store: Option<std::sync::Arc<dyn crate::store::CodeStore>>,
    secret: Option<crate::store::Secret>,
) -> ModuleResult<Vec<Run>> {
    use cranelift_jit::JITModule;
    use std::time::Instant;
    let builder = jit_builder;
    let mut runs = Vec::new();

    let start = Instant::now();
    let mut plain = JITModule::new(builder()?);
    let workload = build(&mut plain, units, stubs)?;
    plain.finalize_definitions()?;
    let time = start.elapsed();
    // SAFETY: finalized host code of this workload, dispatch resolved above.
    let results = unsafe { run(&workload, |id| plain.get_finalized_function(id)) };
    runs.push(Run {
        label: "plain JITModule".into(),
        functions: workload.functions.len(),
        compiled: workload.functions.len() as u64,
        reused: 0,
        loaded: 0,
        aliased: 0,
        trampolined: 0,
        similar_merged: 0,
        code_bytes: workload.compiled_code_bytes,
        time,
        results,
    });

    for &opts in options {
        let start = Instant::now();
        let mut dedup = crate::DedupModule::with_options(builder()?, opts);
        if let Some(store) = &store {
            dedup = dedup.with_store(store.clone(), secret.clone());
        }
        let workload = build(&mut dedup, units, stubs)?;
        dedup.finalize_definitions()?;
        let time = start.elapsed();
        let mut pointers = Vec::new();
        for &(_, id) in &workload.functions {
            pointers.push((id, dedup.try_get_finalized_function(id)?));
        }
        let lookup = |id: FuncId| {
            pointers
                .iter()
                .find(|(i, _)| *i == id)
                .map(|p| p.1)
                .unwrap_or(core::ptr::null())
        };
        // SAFETY: finalized host code of this workload, dispatch resolved above.
        let results = unsafe { run(&workload, lookup) };
        let s = dedup.stats();
        runs.push(Run {
            label: format!("jitfold {opts}"),
            functions: workload.functions.len(),
            compiled: s.compiled,
            reused: s.reused,
            loaded: s.loaded,
            aliased: s.aliased,
            trampolined: s.trampolined,
            similar_merged: s.similar_merged,
            code_bytes: s.code_bytes + s.trampoline_bytes,
            time,
            results,
        });
    }
    Ok(runs)
}
