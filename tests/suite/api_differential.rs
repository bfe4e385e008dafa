//! The `Module` API, differentially: random sequences of declarations,
//! definitions (signatures other than the declared ones, duplicates,
//! calls, loads, bodies that fail, definitions of imports, of ids defined
//! before and never declared) and finalizations give the same outcome
//! under `JITModule` and `DedupModule<JITModule>` in every option set (and
//! under `ObjectModule` and `DedupModule<ObjectModule>`), and every
//! function that can be called returns the same (see
//! `jitfold::fuzzing::api`; the fuzz target `module_api` runs the same
//! check on what libFuzzer finds).

use cranelift_module::Linkage;
use jitfold::fuzzing::api::{self, ApiCall, Body, Sig, Target};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

proptest! {
    // Each case runs its program under seven option sets with `JITModule`
    // and two with `ObjectModule`: 128 cases take seconds.
    // `JITFOLD_API_CASES=N` runs N instead.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("JITFOLD_API_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn random_api_sequences_behave_as_the_wrapped_module(
        bytes in proptest::collection::vec(any::<u8>(), 16..600)
    ) {
        // `JITFOLD_API_TRACE=1`: each program is printed before it runs,
        // so that one that brings the process down can be found.
        if std::env::var_os("JITFOLD_API_TRACE").is_some() {
            use arbitrary::Arbitrary;
            if let Ok(p) = api::ApiProgram::arbitrary(&mut arbitrary::Unstructured::new(&bytes)) {
                eprintln!("PROGRAM {:?}", p.calls);
            }
        }
        if let Some(result) = api::check_bytes(&bytes) {
            match result {
                Ok(ran) => {
                    let total = RAN.fetch_add(1, Ordering::Relaxed) + 1;
                    CALLS.fetch_add(ran.calls, Ordering::Relaxed);
                    EXECUTIONS.fetch_add(ran.executions, Ordering::Relaxed);
                    if total.is_multiple_of(16) {
                        // With `--nocapture`: how much the test ran.
                        eprintln!(
                            "API sequences: {total}, module calls compared: {}, \
                             function calls compared: {}",
                            CALLS.load(Ordering::Relaxed),
                            EXECUTIONS.load(Ordering::Relaxed)
                        );
                    }
                }
                Err(e) => prop_assert!(false, "{}", e),
            }
        }
    }
}

/// Programs checked, module calls and function calls compared so far.
static RAN: AtomicUsize = AtomicUsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);
static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);

/// RustPython's pattern, spelled out: declared without a result, defined
/// with one, a duplicate, a caller through the declaration, each
/// finalized and called.
#[test]
fn declared_without_a_result_and_defined_with_one() {
    let calls = vec![
        ApiCall::DeclareFunction {
            name: 0,
            linkage: Linkage::Export,
            sig: Sig::NoReturn,
        },
        ApiCall::DeclareFunction {
            name: 1,
            linkage: Linkage::Export,
            sig: Sig::NoReturn,
        },
        ApiCall::DeclareFunction {
            name: 2,
            linkage: Linkage::Local,
            sig: Sig::Returns,
        },
        ApiCall::DefineFunction {
            func: Target::Declared(0),
            sig: Sig::Returns,
            body: Body::Mul(3),
        },
        ApiCall::DefineFunction {
            func: Target::Declared(1),
            sig: Sig::Returns,
            body: Body::Mul(3),
        },
        ApiCall::DefineFunction {
            func: Target::Declared(2),
            sig: Sig::Returns,
            body: Body::CallThen { callee: 1, k: 2 },
        },
        ApiCall::Finalize,
    ];
    let ran = api::check_all(&api::ApiProgram { calls }).unwrap();
    // Three functions called four times each, in each JIT option set.
    assert_eq!(ran.executions, 3 * 4 * api::option_sets().len());
}
