//! A function defined with a signature other than its declared one, as
//! RustPython's JIT defines them (declared with the parameters only, the
//! return type pushed onto `ctx.func.signature.returns` while translating):
//! `JITModule` accepts it, and so does `DedupModule`, in every mode, with
//! the same results; trampolines, adapters, thunks and stored entries use
//! the signature it was defined with.

use cranelift_codegen::ir::{AbiParam, InstBuilder, Value, types::I64};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use jitfold::similar::SimilarOptions;
use jitfold::store::{CodeStore, DirectoryStore};
use jitfold::{DedupModule, DedupOptions};
use std::sync::Arc;

fn jit() -> JITModule {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()))
}

/// What a function of the program is defined as: its calling convention
/// and the constant its body adds.
struct Defined {
    name: &'static str,
    call_conv: CallConv,
    k: i64,
}

/// In definition order: `tail` first (compiled), then `a` (the same body
/// in the host's convention: an adapter to `tail` where adapters are made),
/// `b` (a duplicate of `a`), and `c` and `d` (another constant: similar
/// to `a`, and `d` a duplicate of `c`).
const PROGRAM: [Defined; 5] = [
    Defined {
        name: "jit_tail",
        call_conv: CallConv::Tail,
        k: 1,
    },
    Defined {
        name: "jit_a",
        call_conv: CallConv::SystemV,
        k: 1,
    },
    Defined {
        name: "jit_b",
        call_conv: CallConv::SystemV,
        k: 1,
    },
    Defined {
        name: "jit_c",
        call_conv: CallConv::SystemV,
        k: 7,
    },
    Defined {
        name: "jit_d",
        call_conv: CallConv::SystemV,
        k: 7,
    },
];

/// The parameters of every function: more than the registers that carry
/// them, so that the conventions differ in who pops the rest (the callee,
/// in `tail`).
const PARAMS: usize = 8;

/// Declares every function of [`PROGRAM`] with its parameters only, in the
/// host's convention and without a result, then defines each as
/// RustPython does: the declared signature, with the return type (and
/// here the convention) set while translating. Finalizes, and returns
/// the ids.
fn define_program<M: Module>(m: &mut M) -> Vec<FuncId> {
    let mut declared = m.make_signature();
    declared.params = vec![AbiParam::new(I64); PARAMS];
    let ids: Vec<FuncId> = PROGRAM
        .iter()
        .map(|f| {
            m.declare_function(f.name, Linkage::Export, &declared)
                .unwrap()
        })
        .collect();
    let mut fctx = FunctionBuilderContext::new();
    for (f, &id) in PROGRAM.iter().zip(&ids) {
        let mut ctx = m.make_context();
        ctx.func.signature = m.declarations().get_function_decl(id).signature.clone();
        ctx.func.signature.call_conv = f.call_conv;
        ctx.func.signature.returns.push(AbiParam::new(I64));
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let params = b.block_params(entry).to_vec();
        let mut x = params[0];
        for (i, &p) in params.iter().enumerate().skip(1) {
            let t = b.ins().imul_imm_s(p, i as i64 + 1);
            x = b.ins().iadd(x, t);
        }
        let r = sixteen_live(&mut b, x, f.k);
        b.ins().return_(&[r]);
        b.seal_all_blocks();
        b.finalize(m.target_config());
        m.define_function(id, &mut ctx)
            .unwrap_or_else(|e| panic!("{}: {e}", f.name));
    }
    ids
}

/// Sixteen values of `x` alive at once, then combined: more than the
/// registers a caller saves, so that the host's convention saves some in
/// the prologue where the `tail` convention does not, and code compiled
/// for one convention differs from (and breaks callers of) the other.
fn sixteen_live(b: &mut FunctionBuilder, x: Value, k: i64) -> Value {
    let live: Vec<Value> = (1..=16)
        .map(|i| {
            let t = b.ins().imul_imm_s(x, i);
            b.ins().iadd_imm_s(t, k * i)
        })
        .collect();
    let mut acc = b.ins().iconst(I64, 0);
    for (i, &v) in live.iter().enumerate() {
        let t = b.ins().imul(acc, v);
        acc = b.ins().bxor(t, live[(i + 5) % live.len()]);
    }
    acc
}

/// What each function in the host's convention returns for a few
/// arguments: `(name, x, result)`.
fn results(ids: &[FuncId], pointer: impl Fn(FuncId) -> *const u8) -> Vec<(&'static str, i64, i64)> {
    let mut out = Vec::new();
    for (f, &id) in PROGRAM.iter().zip(ids) {
        if f.call_conv != CallConv::SystemV {
            continue;
        }
        for x in [0, 3, -5, 1 << 40] {
            // SAFETY: `id` is finalized, and defined with `PARAMS` `i64`
            // parameters and one `i64` result in the host's convention.
            let f8: extern "C" fn(i64, i64, i64, i64, i64, i64, i64, i64) -> i64 =
                unsafe { std::mem::transmute(pointer(id)) };
            out.push((f.name, x, f8(x, x + 1, x - 2, 3, x, -x, 7, x ^ 5)));
        }
    }
    out
}

/// Every option set (and two batch threads, and a store cold then warm):
/// each module accepts the program and computes what `JITModule` does.
#[test]
fn a_function_defined_with_a_return_type_its_declaration_lacks_runs_in_every_mode() {
    if !cfg!(all(target_arch = "x86_64", unix)) {
        return;
    }
    let mut plain = jit();
    let ids = define_program(&mut plain);
    plain.finalize_definitions().unwrap();
    let expected = results(&ids, |id| plain.get_finalized_function(id));

    let mut options: Vec<DedupOptions> = DedupOptions::ALL.to_vec();
    options.push(DedupOptions::batch().with_threads(2));
    options.push(DedupOptions::batch().with_similar(SimilarOptions::default()));
    options.push(DedupOptions::eager().with_similar(SimilarOptions::default()));
    for options in options {
        let mut m = DedupModule::wrap(jit(), options);
        let ids = define_program(&mut m);
        m.finalize_definitions()
            .unwrap_or_else(|e| panic!("{options}: {e}"));
        assert_eq!(
            results(&ids, |id| m.get_finalized_function(id)),
            expected,
            "{options}"
        );
        // `jit_tail` and `jit_c` compiled; `jit_a` an adapter to
        // `jit_tail`, found and built by the signatures they were defined
        // with (the declared ones have the same convention and no
        // result); `jit_b` and `jit_d` duplicates.
        let stats = m.stats();
        assert_eq!(
            (stats.compiled, stats.adapted),
            (2, 1),
            "{options}: {stats}"
        );
    }

    // Through a store: the cold run stores, the warm one loads, and both
    // compute the same.
    let dir = std::env::temp_dir().join(format!("jitfold-signatures-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store: Arc<dyn CodeStore> = Arc::new(DirectoryStore::new(&dir).unwrap());
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        for run in ["cold", "warm"] {
            let mut m = DedupModule::wrap(jit(), options).with_store(store.clone(), None);
            let ids = define_program(&mut m);
            m.finalize_definitions().unwrap();
            assert_eq!(
                results(&ids, |id| m.get_finalized_function(id)),
                expected,
                "{options}, {run}"
            );
            if run == "warm" {
                assert!(m.stats().loaded > 0, "{options}: {}", m.stats());
                assert_eq!(m.stats().compiled, 0, "{options}: {}", m.stats());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
