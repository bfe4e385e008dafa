//! The differential check: a generated program compiled with plain
//! `JITModule` and through `DedupModule` in every mode and option must
//! return the same bits for every call; and the fingerprint laws hold on its
//! functions.
//!
//! # What this module guarantees
//!
//! [`check`] returns `Err` (with a description) exactly when one of these
//! fails, and panics never on a generated program:
//!
//! 1. Every generated function passes the verifier.
//! 2. Fingerprint laws: a twin (also one that declares its callees in
//!    another order) has its original's fingerprint and template;
//!    a mutant whose changed constant is used in a reachable block has
//!    another fingerprint, and one whose changed constant is not has the
//!    same; likewise a flag mutant (condition code, memory flags, trap
//!    code, calling convention, extension) whose change is reachable; a
//!    frame mutant has another fingerprint exactly when its frame (slots in
//!    index order, and which of them reachable code uses) differs; every
//!    key is its template followed by its names
//!    ([`Template::with_names`](crate::Template::with_names)).
//! 3. Every function called on every input returns the same value, or traps
//!    likewise, under plain `JITModule` and under `DedupModule` with each
//!    of [`DedupOptions::ALL`] and with [similar-function
//!    merging](similar_options) (batch mode, every group of one shape
//!    merged, so that constant mutants become thunks of one body and must
//!    return their own results; calls run in child processes,
//!    [`isolated`], so a trap is an outcome, not the end
//!    of the check).
//! 4. Where the Cranelift interpreter runs the program (no float operations,
//!    whose NaN bits the interpreter does not model like the hardware), it
//!    returns the same values and traps on the same calls as plain
//!    `JITModule`.
//! 5. Machine code ([`machine_code`](super::machine_code)), checked before
//!    the calls of each option: every function `DedupModule` merged into
//!    another (with any of the options) compiles, on its own, to the same
//!    code as that function, callees compared by class; and every function
//!    compiles to the code of the first function with its template,
//!    renamed slot for slot (what code reuse hands out). A difference that
//!    remains after laying both out in one block order fails the check
//!    with both functions, what differs and both disassemblies.
//! 6. The first function, with each of a set of defects the key does not
//!    see added ([`defects`](super::defects)), compiles through
//!    `DedupModule` (eager, and batch) exactly when it compiles in plain
//!    `JITModule`, after the function itself was compiled.
//! 7. Every function returns the same value, or traps likewise, through
//!    modules on a code store: one that loads what another stored, and
//!    two that define the program at once, dividing its compiles (see
//!    `stored.rs`).

use super::isolated::{self, Entry};
use super::machine_code::Oracle;
use super::program::{Callee, Form, Op, Program, emit};
use crate::similar::{CostModel, SimilarOptions, StackDepth};
use crate::{DedupModule, DedupOptions, Fingerprint};
use cranelift_codegen::data_value::DataValue;
use cranelift_codegen::ir::{ArgumentExtension, Function, UserFuncName};
use cranelift_codegen::settings::FlagsOrIsa;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};

/// What a passing check saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Functions in the program.
    pub functions: usize,
    /// Functions `DedupModule` did not compile (most over all options).
    pub merged: usize,
    /// Functions defined from reused code (most over all options).
    pub reused: usize,
    /// Functions compiled as an adapter to a function that differs only in
    /// its calling convention (most over all options).
    pub adapted: usize,
    /// Calls compared.
    pub calls: usize,
    /// Calls that trapped.
    pub traps: usize,
    /// Whether the interpreter also ran the program (check 4).
    pub interpreted: bool,
    /// Pairs of functions whose machine code was compared (check 5).
    pub code_compared: usize,
    /// Functions turned into thunks of a merged body by
    /// [similar-function merging](similar_options).
    pub similar_merged: usize,
    /// Functions a module defined from a code store's entries (most over
    /// the options of check 7).
    pub loaded: usize,
    /// Functions the loading module of check 7 on a store with no room
    /// defined from the store's entries.
    pub loaded_without_room: usize,
    /// Functions that module compiled (their entries dropped, or never
    /// made: a function of a template already defined reuses its code).
    pub compiled_without_room: usize,
}

/// The options of check 3's similar-function merging: batch mode, with a
/// cost model that counts only the code removed (every group of two or
/// more pays) and up to 16 parameters, so that the generated functions,
/// small as they are, merge wherever their shapes allow.
pub fn similar_options() -> DedupOptions {
    let model = CostModel {
        thunk_bytes: 0,
        thunk_bytes_per_param: 0,
        thunk_stack_bytes: 0,
        thunk_bytes_per_stack_arg: 0,
        thunk_stack_check_bytes: 0,
        body_bytes_per_param: 0,
        body_bytes_per_stack_param: 0,
        ..CostModel::X86_64
    };
    // Functions with a stack limit are kept apart: a program computes its
    // limits, and one near the top of the address space (a negative
    // number) makes Cranelift's check wrap for a frame of one size and not
    // another, so a merged thunk may trap where its member does not (seed
    // 203 of `fuzz_seeds` did); the check compares every trap. (Merging
    // them is bounded otherwise; see `jitfold::similar::StackDepth` and
    // its own tests.)
    let stack = StackDepth::Exact;
    DedupOptions::batch().with_similar(SimilarOptions {
        max_params: 16,
        model,
        stack,
    })
}

/// Interpreter steps a call may take before the interpreter gives up on
/// the program (check 4 is then skipped). Calls among generated functions
/// can nest deeply enough for the interpreter, a thousand times slower than
/// native code, to take seconds: a fuzzer's slow unit, not a finding.
const INTERPRETER_FUEL: u64 = 1_000_000;

/// Runs every function on every input in the Cranelift interpreter (`None`
/// for a call that traps). `None` when the program uses float operations or
/// the interpreter cannot run it.
fn interpret(program: &Program, funcs: &[Function]) -> Option<Vec<Option<i64>>> {
    use cranelift_interpreter::environment::FunctionStore;
    use cranelift_interpreter::interpreter::{Interpreter, InterpreterState};
    use cranelift_interpreter::step::{ControlFlow, CraneliftTrap};
    // Stack addresses and stack limits are the native frame's, which the
    // interpreter does not lay out like the hardware.
    if program.any_op(|op| matches!(op, Op::Float(..) | Op::SlotDistance(..)))
        || program.any_stack_limit()
    {
        return None;
    }
    let mut store = FunctionStore::default();
    for f in funcs {
        store.add(f.name.to_string(), f);
    }
    let mut out = Vec::new();
    for f in funcs {
        for &(a, b) in &program.inputs {
            let state = InterpreterState::default().with_function_store(store.clone());
            let mut interpreter = Interpreter::new(state).with_fuel(Some(INTERPRETER_FUEL));
            let args = [DataValue::I64(a), DataValue::I64(b)];
            match interpreter.call_by_name(&f.name.to_string(), &args) {
                Ok(ControlFlow::Return(values)) => match values.first() {
                    Some(DataValue::I64(r)) => out.push(Some(*r)),
                    // An extended `i32` result, as the callee's ABI extends it.
                    Some(DataValue::I32(r)) => match f.signature.returns[0].extension {
                        ArgumentExtension::Uext => out.push(Some(i64::from(*r as u32))),
                        ArgumentExtension::Sext => out.push(Some(i64::from(*r))),
                        ArgumentExtension::None => return None,
                    },
                    _ => return None,
                },
                Ok(ControlFlow::Trap(CraneliftTrap::User(_))) => out.push(None),
                _ => return None,
            }
        }
    }
    Some(out)
}

/// Builds function `index` of `program`; `callee(j)` declares function `j`
/// inside the function being built and gives its reference (a new one
/// each time).
fn build(
    program: &Program,
    index: usize,
    func: &mut Function,
    callee: &mut dyn FnMut(usize, &mut Function) -> cranelift_codegen::ir::FuncRef,
) {
    let (body, variant) = program.body(index);
    // Whose callees the body calls: its original's, except for a relinked
    // twin, which calls the functions after itself.
    let origin = match program.functions[index] {
        Form::Original(_) | Form::Relinked { .. } => index,
        Form::Twin { of }
        | Form::Mutant { of, .. }
        | Form::FrameMutant { of, .. }
        | Form::DeclTwin { of, .. }
        | Form::FlagMutant { of, .. } => of,
    };
    let (reversed, duplicates) = match program.functions[index] {
        Form::DeclTwin { duplicates, .. } => (true, duplicates),
        Form::Original(_)
        | Form::Relinked { .. }
        | Form::Twin { .. }
        | Form::Mutant { .. }
        | Form::FrameMutant { .. }
        | Form::FlagMutant { .. } => (false, false),
    };
    let mut order: Vec<usize> = (origin + 1..program.functions.len()).collect();
    if reversed {
        order.reverse();
    }
    let mut declared = vec![None; program.functions.len()];
    for j in order {
        let call = callee(j, func);
        let address = if duplicates { callee(j, func) } else { call };
        // A second, identical signature for indirect calls.
        let signature = if duplicates {
            let sig = func.dfg.signatures[func.dfg.ext_funcs[address].signature].clone();
            func.import_signature(sig)
        } else {
            func.dfg.ext_funcs[address].signature
        };
        declared[j] = Some(Callee {
            call,
            address,
            signature,
        });
    }
    let callees: Vec<Callee> = declared.into_iter().flatten().collect();
    // A recursive body calls the function being built, whatever it is.
    let own = body.recurse.map(|_| callee(index, func));
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(func, &mut fctx);
    emit(&mut b, &body, &callees, own, variant);
    b.finalize(cranelift_codegen::isa::TargetFrontendConfig {
        default_call_conv: func_call_conv(),
        pointer_width: target_lexicon::PointerWidth::U64,
        page_size_align_log2: 12,
    });
}

fn func_call_conv() -> cranelift_codegen::isa::CallConv {
    cranelift_codegen::isa::CallConv::triple_default(&target_lexicon::Triple::host())
}

/// The signature of function `index`.
fn signature(program: &Program, index: usize) -> cranelift_codegen::ir::Signature {
    program.body(index).0.signature()
}

/// The functions of `program` outside any module: callee `j` is the user
/// name `u0:j`, as `Module::declare_func_in_func` names it.
pub fn functions(program: &Program) -> Vec<Function> {
    (0..program.functions.len())
        .map(|i| {
            let mut func = Function::with_name_signature(
                UserFuncName::user(0, i as u32),
                signature(program, i),
            );
            build(program, i, &mut func, &mut |j, f| {
                let sig = f.import_signature(signature(program, j));
                let name = f.declare_imported_user_function(
                    cranelift_codegen::ir::UserExternalName::new(0, j as u32),
                );
                f.import_function(cranelift_codegen::ir::ExtFuncData {
                    name: cranelift_codegen::ir::ExternalName::user(name),
                    signature: sig,
                    colocated: true,
                    patchable: false,
                })
            });
            func
        })
        .collect()
}

/// Checks the fingerprint laws (1 and 2 of the module docs).
pub fn check_fingerprints(program: &Program) -> Result<(), String> {
    let funcs = functions(program);
    let flags = crate::isa::flags(&[]).map_err(|e| e.to_string())?;
    for (i, f) in funcs.iter().enumerate() {
        cranelift_codegen::verify_function(f, FlagsOrIsa::from(&flags))
            .map_err(|e| format!("f{i} fails the verifier: {e}\n{}", f.display()))?;
    }
    let mut fingerprinter = crate::Fingerprinter::new();
    let mut fps: Vec<Fingerprint> = Vec::with_capacity(funcs.len());
    for (i, f) in funcs.iter().enumerate() {
        let walk = fingerprinter.walk(f);
        let fp = walk.fingerprint();
        // The key is the template followed by the names, slot for slot.
        let rebuilt = walk.template().with_names(walk.names());
        if rebuilt != fp || rebuilt.key() != fp.key() {
            return Err(format!("f{i}: template and names do not rebuild the key"));
        }
        fps.push(fp);
    }
    for (i, form) in program.functions.iter().enumerate() {
        let (of, expect_equal) = match form {
            // A relinked twin calls other functions: no law about its key
            // (its calls are checked by execution).
            Form::Original(_) | Form::Relinked { .. } => continue,
            Form::Twin { of } => (*of, true),
            Form::Mutant { of, which, .. } => {
                let body = program.body(*of).0;
                let k = which % body.constants.len();
                let used = body.reachable_ops().any(
                    |op| matches!(op, Op::Const(_, c) if *c as usize % body.constants.len() == k),
                );
                let changed = program.body(i).0.constants[k] != body.constants[k];
                (*of, !(used && changed))
            }
            Form::FlagMutant { of, flag } => {
                let changed = program.body(*of).0.mutate(*flag);
                (*of, !changed)
            }
            // Cranelift lays the frame out in slot index order.
            Form::FrameMutant { of, .. } => (
                *of,
                program.body(i).0.frame() == program.body(*of).0.frame(),
            ),
            Form::DeclTwin {
                of,
                duplicates: false,
            } => (*of, true),
            // Whether content-identical declarations are one entry of the
            // key is the walk's choice: no law here; its merges are checked
            // by machine code and execution.
            Form::DeclTwin {
                duplicates: true, ..
            } => continue,
        };
        if expect_equal && fps[i].to_template() != fps[of].to_template() {
            return Err(format!(
                "f{i} ({form:?}) and f{of}: equal keys, other templates"
            ));
        }
        // A recursive function calls itself, so its twins call another
        // name: only their templates are equal (call-graph refinement
        // merges them).
        let recursive = program.body(of).0.recurse.is_some();
        let equal = if recursive {
            fps[i].to_template() == fps[of].to_template()
        } else {
            fps[i] == fps[of]
        };
        if equal != expect_equal {
            return Err(format!(
                "f{i} ({form:?}) and f{of}: fingerprints {}equal, expected {}equal\n{}\n{}",
                if equal { "" } else { "not " },
                if expect_equal { "" } else { "not " },
                funcs[i].display(),
                funcs[of].display()
            ));
        }
    }
    Ok(())
}

pub(super) fn jit_builder() -> Result<JITBuilder, String> {
    jit_builder_with(&[])
}

/// The harness's `JITBuilder`, with `flags` beside its own.
pub(super) fn jit_builder_with(flags: &[(&str, &str)]) -> Result<JITBuilder, String> {
    let mut all = vec![("opt_level", "speed")];
    all.extend_from_slice(flags);
    JITBuilder::with_flags(&all, default_libcall_names()).map_err(|e| e.to_string())
}

/// Builds function `index` of `program` into `func`, signature included
/// (see [`build`]).
pub(super) fn build_function(
    program: &Program,
    index: usize,
    func: &mut Function,
    callee: &mut dyn FnMut(usize, &mut Function) -> cranelift_codegen::ir::FuncRef,
) {
    func.signature = signature(program, index);
    build(program, index, func, callee);
}

/// Declares and defines every function of `program` in `m`.
pub(super) fn define_all<M: Module>(m: &mut M, program: &Program) -> Result<Vec<FuncId>, String> {
    let ids: Vec<FuncId> = (0..program.functions.len())
        .map(|i| m.declare_function(&format!("f{i}"), Linkage::Local, &signature(program, i)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    for (i, &id) in ids.iter().enumerate() {
        let mut ctx = m.make_context();
        ctx.func.signature = signature(program, i);
        build(program, i, &mut ctx.func, &mut |j, f| {
            m.declare_func_in_func(ids[j], f)
        });
        m.define_function(id, &mut ctx)
            .map_err(|e| format!("defining f{i}: {e:?}"))?;
    }
    Ok(ids)
}

/// Calls every function on every input, in child processes (a new one
/// after each trap).
pub(super) fn call_all(
    program: &Program,
    pointers: &[*const u8],
) -> Result<Vec<Option<i64>>, String> {
    let mut calls = Vec::new();
    for &ptr in pointers {
        // SAFETY: every generated function has the signature
        // `(i64, i64) -> i64` in a convention called like the host's
        // default, is finalized and terminates (see `program`).
        let entry: Entry = unsafe { core::mem::transmute(ptr) };
        calls.extend(program.inputs.iter().map(|&(a, b)| (entry, a, b)));
    }
    isolated::run(&calls)
}

/// Runs the whole check (see the module docs).
pub fn check(program: &Program) -> Result<Outcome, String> {
    check_fingerprints(program)?;

    let mut plain = JITModule::new(jit_builder()?);
    let ids = define_all(&mut plain, program)?;
    plain.finalize_definitions().map_err(|e| e.to_string())?;
    let pointers: Vec<_> = ids
        .iter()
        .map(|&id| plain.get_finalized_function(id))
        .collect();
    let expected = call_all(program, &pointers)?;

    let mut outcome = Outcome {
        functions: ids.len(),
        calls: expected.len(),
        traps: expected.iter().filter(|r| r.is_none()).count(),
        ..Outcome::default()
    };
    let funcs = functions(program);
    if let Some(interpreted) = interpret(program, &funcs) {
        if interpreted != expected {
            let at = first_difference(&interpreted, &expected);
            return Err(format!(
                "interpreter and plain JIT disagree at call {at}: {} vs {}",
                shown(interpreted[at]),
                shown(expected[at])
            ));
        }
        outcome.interpreted = true;
    }
    let mut oracle = Oracle::new(plain.isa(), &funcs);
    oracle.check_templates()?;
    for options in DedupOptions::ALL.into_iter().chain([similar_options()]) {
        let mut dedup = DedupModule::wrap(JITModule::new(jit_builder()?), options);
        let ids = define_all(&mut dedup, program)?;
        dedup.finalize_definitions().map_err(|e| e.to_string())?;
        oracle.check_merged(
            &merged_pairs(&dedup, &ids),
            options.distinct_addresses,
            &format!("{options}"),
        )?;
        let pointers = ids
            .iter()
            .map(|&id| dedup.try_get_finalized_function(id))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let got = call_all(program, &pointers).map_err(|e| format!("{options}: {e}"))?;
        same_results(program, &got, &expected, &format!("{options:?}"))?;
        let s = dedup.stats();
        outcome.merged = outcome.merged.max((s.aliased + s.trampolined) as usize);
        outcome.reused = outcome.reused.max(s.reused as usize);
        outcome.adapted = outcome.adapted.max(s.adapted as usize);
        outcome.similar_merged = outcome.similar_merged.max(s.similar_merged as usize);
        // SAFETY: no pointer into this module's code is used after this.
        unsafe { dedup.into_inner().free_memory() };
    }
    outcome.code_compared = oracle.compared();
    super::stored::check(program, &expected, &mut outcome)?;
    // SAFETY: as above.
    unsafe { plain.free_memory() };
    super::defects::check(program, 0)?;
    Ok(outcome)
}

/// `Err` naming the first call whose result through jitfold (`got`, run
/// as `how` says) differs from plain `JITModule`'s (`expected`).
pub(super) fn same_results(
    program: &Program,
    got: &[Option<i64>],
    expected: &[Option<i64>],
    how: &str,
) -> Result<(), String> {
    if got == expected {
        return Ok(());
    }
    let at = first_difference(got, expected);
    let (f, input) = (
        at / program.inputs.len(),
        program.inputs[at % program.inputs.len()],
    );
    Err(format!(
        "{how}: f{f}{input:?} = {} through jitfold, {} plainly",
        shown(got[at]),
        shown(expected[at])
    ))
}

/// `(function, the function it runs the code of)` for every function of
/// `dedup` (declared as `ids`, in program order) that is a duplicate.
fn merged_pairs<M: Module>(dedup: &DedupModule<M>, ids: &[FuncId]) -> Vec<(usize, usize)> {
    let index = |id: FuncId| ids.iter().position(|&i| i == id);
    ids.iter()
        .enumerate()
        .filter_map(|(i, &id)| {
            let into = index(dedup.canonical(id)?)?;
            (into != i).then_some((i, into))
        })
        .collect()
}

/// A call's result as a message shows it.
fn shown(result: Option<i64>) -> String {
    result.map_or_else(|| "a trap".to_string(), |r| r.to_string())
}

/// The index of the first call whose results differ (0 if none does).
fn first_difference(a: &[Option<i64>], b: &[Option<i64>]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function that counts to `n` in a loop: about `5 * n` interpreter
    /// steps.
    fn counting_to(n: i64) -> Function {
        let text = format!(
            "function %count(i64, i64) -> i64 {{
             block0(v0: i64, v1: i64):
                 v2 = iconst.i64 0
                 jump block1(v2)
             block1(v3: i64):
                 v4 = iconst.i64 1
                 v5 = iadd v3, v4
                 v6 = iconst.i64 {n}
                 v7 = icmp ult v5, v6
                 brif v7, block1(v5), block2(v5)
             block2(v8: i64):
                 return v8
             }}"
        );
        cranelift_reader::parse_functions(&text).unwrap().remove(0)
    }

    /// The interpreter oracle gives up on a call after a million steps
    /// ([`INTERPRETER_FUEL`]; a fuzzed program once kept it busy for 12 s
    /// with ten times as many), and still answers calls that need fewer.
    #[test]
    fn interpreter_gives_up_after_its_fuel() {
        let program = Program {
            functions: Vec::new(),
            inputs: vec![(0, 0)],
        };
        let short = counting_to(1_000);
        assert_eq!(
            interpret(&program, std::slice::from_ref(&short)),
            Some(vec![Some(1_000)])
        );
        // About 2M steps: within the 10M the oracle had before, beyond the
        // 1M it has now.
        let long = counting_to(400_000);
        assert_eq!(interpret(&program, std::slice::from_ref(&long)), None);
    }
}
