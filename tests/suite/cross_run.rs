//! Deduplicated code as relocatable objects, linked and run: every program
//! is compiled for aarch64 and for x86-64 with plain `ObjectModule` and
//! through `DedupModule` in every `DedupOptions::ALL` mode, linked with a
//! generated C harness (`aarch64-linux-gnu-gcc -static`, run under
//! `qemu-aarch64`; the host's `cc` for x86-64), and every result is compared
//! with the x86-64 JIT run of the same program. The harness also checks
//! that a duplicate's symbol is its canonical function's address exactly
//! when addresses are not distinct.
//!
//! Programs: `tests/data/cross/cases.clif` (twins, callers of twins,
//! tail-call twins, twelve-argument calls, code reuse, and similar `tail`
//! functions with a stack limit, which it also compiles with similar
//! merging: thunks that tail-call a body that checks) and programs of the
//! fuzz generator (those without float operations, whose NaN bits differ
//! between ISAs, and without traps or other signatures).

#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use crate::common;

use arbitrary::{Arbitrary, Unstructured};
use cranelift_codegen::ir::{Function, UserFuncName, types::I64};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use cranelift_object::{ObjectBuilder, ObjectModule};
use jitfold::corpus::bind_names;
use jitfold::fuzzing::program::{Op, Program as Generated};
use jitfold::similar::SimilarOptions;
use jitfold::{DedupModule, DedupOptions, Stats};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Functions to compile, and which of them C calls with which arguments.
struct Program {
    name: String,
    functions: Vec<Function>,
    /// (function index, argument vectors) for each function called from C.
    entries: Vec<(usize, Vec<Vec<i64>>)>,
}

/// Argument vectors for a function of `arity` i64 parameters.
fn inputs(arity: usize) -> Vec<Vec<i64>> {
    [1i64, -7, 0x1234_5678_9abc]
        .iter()
        .map(|&base| {
            (0..arity as i64)
                .map(|i| base.wrapping_mul(i + 3) ^ (i << 9))
                .collect()
        })
        .collect()
}

fn hand_written() -> Program {
    let text = std::fs::read_to_string(common::data_dir().join("cross/cases.clif")).unwrap();
    let functions = common::parse_valid(&text);
    let entries = functions
        .iter()
        .enumerate()
        .filter(|(_, f)| f.signature.call_conv == CallConv::SystemV)
        .map(|(i, f)| (i, inputs(f.signature.params.len())))
        .collect();
    Program {
        name: "cases".to_string(),
        functions,
        entries,
    }
}

/// Programs of the fuzz generator without float operations (whose NaN bits
/// differ between ISAs), without traps (which would end the harness), and
/// with the default signature (which C calls alike on every ISA).
fn generated(count: usize) -> Vec<Program> {
    let mut out = Vec::new();
    for seed in 0.. {
        if out.len() == count {
            break;
        }
        let data = common::seed_bytes(seed, 512);
        let Ok(program) = Generated::arbitrary(&mut Unstructured::new(&data)) else {
            continue;
        };
        let other_signatures = (0..program.functions.len()).any(|i| {
            let body = program.body(i).0;
            body.call_conv != 0 || body.extension != 0
        });
        // Frame layouts and stack limits differ between ISAs too.
        let frame =
            program.any_stack_limit() || program.any_op(|op| matches!(op, Op::SlotDistance(..)));
        if other_signatures
            || frame
            || program.any_op(|op| matches!(op, Op::Float(..) | Op::Trapping(..)))
        {
            continue;
        }
        let inputs: Vec<Vec<i64>> = program.inputs.iter().map(|&(a, b)| vec![a, b]).collect();
        let functions = jitfold::fuzzing::differential::functions(&program);
        out.push(Program {
            name: format!("seed{seed}"),
            entries: (0..functions.len()).map(|i| (i, inputs.clone())).collect(),
            functions,
        });
    }
    out
}

/// Declares and defines `program` in `m`, every function hidden (global to the link) as
/// `{prefix}{index}`; returns the ids in function order.
fn define<M: Module>(m: &mut M, program: &Program, prefix: &str) -> Vec<FuncId> {
    let mut names: HashMap<UserFuncName, FuncId> = HashMap::new();
    let ids: Vec<FuncId> = program
        .functions
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let id = m
                .declare_function(&format!("{prefix}{i}"), Linkage::Hidden, &f.signature)
                .unwrap();
            names.insert(f.name.clone(), id);
            id
        })
        .collect();
    for (f, &id) in program.functions.iter().zip(&ids) {
        let mut ctx = m.make_context();
        ctx.func = f.clone();
        bind_names(&mut ctx.func, id, &names).unwrap();
        m.define_function(id, &mut ctx)
            .unwrap_or_else(|e| panic!("{} {}: {e:?}", program.name, f.name));
    }
    ids
}

/// The results of every entry on every input, run by the x86-64 JIT.
fn host_results(program: &Program) -> Vec<i64> {
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    let mut m = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
    let ids = define(&mut m, program, "f");
    m.finalize_definitions().unwrap();
    let mut out = Vec::new();
    for (index, args) in &program.entries {
        let ptr = m.get_finalized_function(ids[*index]);
        for a in args {
            out.push(call_host(ptr, a));
        }
    }
    out
}

/// Calls finalized host code of signature `(i64 x args.len()) -> i64`.
fn call_host(ptr: *const u8, a: &[i64]) -> i64 {
    // SAFETY: the entries of every program have the System V convention,
    // `a.len()` i64 parameters and one i64 result, and are finalized.
    unsafe {
        match a.len() {
            1 => std::mem::transmute::<*const u8, extern "C" fn(i64) -> i64>(ptr)(a[0]),
            2 => std::mem::transmute::<*const u8, extern "C" fn(i64, i64) -> i64>(ptr)(a[0], a[1]),
            12 => std::mem::transmute::<
                *const u8,
                extern "C" fn(i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64) -> i64,
            >(ptr)(
                a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
            ),
            n => panic!("no host call for {n} arguments"),
        }
    }
}

/// One compilation of a program for one ISA.
struct Object {
    path: PathBuf,
    prefix: String,
    /// (duplicate, canonical) function indices, and whether they share an
    /// address.
    duplicates: Vec<(usize, usize, bool)>,
    stats: Option<Stats>,
}

fn compile_object(
    isa: &OwnedTargetIsa,
    program: &Program,
    options: Option<DedupOptions>,
    prefix: &str,
    dir: &Path,
) -> Object {
    let builder = ObjectBuilder::new(isa.clone(), prefix, default_libcall_names()).unwrap();
    let inner = ObjectModule::new(builder);
    let (bytes, duplicates, stats) = match options {
        None => {
            let mut m = inner;
            define(&mut m, program, prefix);
            (m.finish().emit().unwrap(), Vec::new(), None)
        }
        Some(options) => {
            let mut m = DedupModule::wrap(inner, options);
            let ids = define(&mut m, program, prefix);
            m.flush().unwrap();
            let index: HashMap<FuncId, usize> =
                ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
            let duplicates = ids
                .iter()
                .enumerate()
                .filter_map(|(i, &id)| {
                    let canonical = m.canonical(id)?;
                    (canonical != id).then(|| (i, index[&canonical], m.address_of(id) != Some(id)))
                })
                .collect();
            let stats = m.stats().clone();
            (m.finish().emit().unwrap(), duplicates, Some(stats))
        }
    };
    let path = dir.join(format!("{prefix}.o"));
    std::fs::write(&path, bytes).unwrap();
    Object {
        path,
        prefix: prefix.to_string(),
        duplicates,
        stats,
    }
}

/// The C harness: prints one line per call, then one per address check.
fn harness(programs: &[(&Program, Vec<Object>)]) -> String {
    let mut decls = String::from("#include <stdio.h>\n");
    let mut body = String::from("int main(void) {\n");
    for (program, objects) in programs {
        for object in objects {
            for i in 0..program.functions.len() {
                writeln!(decls, "extern void {}{i}(void);", object.prefix).unwrap();
            }
            for (index, args) in &program.entries {
                let params = vec!["long long"; args[0].len()].join(", ");
                for a in args {
                    let list: Vec<String> = a.iter().map(|x| format!("{x}LL")).collect();
                    writeln!(
                        body,
                        "  printf(\"%lld\\n\", ((long long (*)({params})){}{index})({}));",
                        object.prefix,
                        list.join(", ")
                    )
                    .unwrap();
                }
            }
            for (dup, canonical, _) in &object.duplicates {
                writeln!(
                    body,
                    "  printf(\"%d\\n\", (void *){p}{dup} == (void *){p}{canonical});",
                    p = object.prefix
                )
                .unwrap();
            }
        }
    }
    body.push_str("  return 0;\n}\n");
    decls + &body
}

/// Links `inputs` (C sources and objects) into `exe` with `tools`, runs
/// it (under the target's runner) and returns what it printed; panics if
/// either step fails.
fn link_and_run(tools: &Toolchain, exe: &Path, inputs: &[&Path]) -> String {
    let linked = Command::new(tools.cc)
        .args(tools.cc_flags)
        .arg("-o")
        .arg(exe)
        .args(inputs)
        .output()
        .unwrap();
    assert!(
        linked.status.success(),
        "linking failed: {}",
        String::from_utf8_lossy(&linked.stderr)
    );
    let run = match tools.runner {
        Some(runner) => Command::new(runner).arg(exe).output(),
        None => Command::new(exe).output(),
    }
    .unwrap();
    assert!(
        run.status.success(),
        "the harness failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout).unwrap()
}

/// How to build and run an executable for one target.
struct Toolchain {
    cc: &'static str,
    cc_flags: &'static [&'static str],
    runner: Option<&'static str>,
}

/// The toolchain for `target`, or `None` (with a message saying how to
/// install it) on a developer machine without it. Under CI a missing tool
/// fails the test instead.
fn toolchain(target: &str) -> Option<Toolchain> {
    let (tools, chain, install) = match target {
        "aarch64" => (
            ["aarch64-linux-gnu-gcc", "qemu-aarch64"].as_slice(),
            Toolchain {
                cc: "aarch64-linux-gnu-gcc",
                cc_flags: &["-static"],
                runner: Some("qemu-aarch64"),
            },
            "apt-get install gcc-aarch64-linux-gnu qemu-user",
        ),
        _ => (
            ["cc"].as_slice(),
            Toolchain {
                cc: "cc",
                cc_flags: &["-no-pie"],
                runner: None,
            },
            "apt-get install gcc",
        ),
    };
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| Command::new(t).arg("--version").output().is_err())
        .collect();
    if missing.is_empty() {
        return Some(chain);
    }
    let message = format!("{missing:?} not found; install with `{install}`");
    if std::env::var_os("CI").is_some() {
        panic!("CI must run the {target} execution test: {message}");
    }
    eprintln!("skipping the {target} execution test: {message}");
    None
}

/// An empty directory of this process's own for `what` on `target`.
fn empty_dir(what: &str, target: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jitfold-{what}-{target}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn check_target(target: &str, triple: &str) {
    let Some(tools) = toolchain(target) else {
        return;
    };
    let isa = jitfold::isa::isa_by_name(triple, jitfold::isa::jit_flags()).unwrap();
    let dir = empty_dir("cross", target);

    let mut programs = vec![hand_written()];
    programs.extend(generated(24));
    let mut compiled = Vec::new();
    let mut expected = Vec::new();
    let mut totals = Stats::default();
    let variants: Vec<Option<DedupOptions>> = std::iter::once(None)
        .chain(DedupOptions::ALL.map(Some))
        .collect();
    // The hand-written program also with similar merging of functions
    // with a stack limit (which `ALL` keeps apart: `StackDepth::Exact`).
    let similar = DedupOptions::batch().with_similar(SimilarOptions::default());
    for (p, program) in programs.iter().enumerate() {
        let results = host_results(program);
        let mut objects = Vec::new();
        let mut variants = variants.clone();
        if p == 0 {
            variants.push(Some(similar));
        }
        for (v, &options) in variants.iter().enumerate() {
            let object = compile_object(&isa, program, options, &format!("p{p}v{v}_"), &dir);
            expected.extend(results.iter().copied());
            expected.extend(object.duplicates.iter().map(|d| i64::from(d.2)));
            if let Some(s) = &object.stats {
                totals += s.clone();
                // The three members with a stack limit, merged.
                if options == Some(similar) {
                    assert_eq!(s.similar_merged, 3, "{s:?}");
                }
            }
            objects.push(object);
        }
        compiled.push((program, objects));
    }
    let c = dir.join("harness.c");
    std::fs::write(&c, harness(&compiled)).unwrap();
    let exe = dir.join("harness");
    let mut inputs = vec![c.as_path()];
    for (_, objects) in &compiled {
        inputs.extend(objects.iter().map(|o| o.path.as_path()));
    }
    let output = link_and_run(&tools, &exe, &inputs);
    let got: Vec<i64> = output.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(got.len(), expected.len(), "one line per call and check");
    if let Some(at) = got.iter().zip(&expected).position(|(g, e)| g != e) {
        panic!(
            "{target}: line {at} of the harness output is {}, the x86-64 JIT says {}",
            got[at], expected[at]
        );
    }
    // The programs really merged, reused and kept distinct addresses.
    assert!(totals.aliased >= 20, "{totals:?}");
    assert!(totals.trampolined >= 20, "{totals:?}");
    assert!(totals.reused >= 4, "{totals:?}");
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{target}: {} results compared, {} aliased, {} trampolined, {} reused",
        got.len(),
        totals.aliased,
        totals.trampolined,
        totals.reused
    );
}

/// How deep merged functions with a stack limit recurse before it traps,
/// on `target`, as objects linked with a C harness that makes each call in
/// a child process: the `tail` members of
/// `similar::a_merged_recursion_traps_for_its_stack_within_the_growth_bound`,
/// compiled plainly and with similar merging (thunks that tail-call a body
/// that checks the limit). For each member: the merged call returns what
/// the plain one returns, traps with no room, and needs at most the
/// group's stack growth per level more room than the plain one.
fn check_stack_depth(target: &str, triple: &str) {
    const DEPTH: i64 = 40;
    let Some(tools) = toolchain(target) else {
        return;
    };
    let isa = jitfold::isa::isa_by_name(triple, jitfold::isa::jit_flags()).unwrap();
    let dir = empty_dir("depth", target);
    let texts = [
        crate::similar::recursing_to_the_limit(0, "tail", 3),
        crate::similar::recursing_to_the_limit(1, "tail", -5),
        crate::similar::entry_with_a_limit(2, 0, "tail"),
        crate::similar::entry_with_a_limit(3, 1, "tail"),
    ];
    let program = Program {
        name: "stack depth".to_string(),
        functions: texts.iter().flat_map(|t| common::parse_valid(t)).collect(),
        entries: Vec::new(),
    };
    let similar = DedupOptions::batch().with_similar(SimilarOptions::default());
    let plain = compile_object(&isa, &program, None, "plain_", &dir);
    let merged = compile_object(&isa, &program, Some(similar), "merged_", &dir);
    assert_eq!(merged.stats.as_ref().unwrap().similar_merged, 2);
    let mut c = String::from(
        "#include <stdio.h>\n#include <unistd.h>\n#include <sys/wait.h>\n\
         typedef long long (*entry)(long long, long long);\n",
    );
    for prefix in ["plain_", "merged_"] {
        for i in 0..4 {
            writeln!(c, "extern long long {prefix}{i}(long long, long long);").unwrap();
        }
    }
    writeln!(
        c,
        "/* Whether f(gap, {DEPTH}) returns, in a child (a trap ends it), and what. */
static int returns(entry f, long long gap, long long *result) {{
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {{
    long long r = f(gap, {DEPTH});
    if (write(fds[1], &r, sizeof r) != sizeof r) _exit(2);
    _exit(0);
  }}
  close(fds[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0
    && read(fds[0], result, sizeof *result) == sizeof *result;
  close(fds[0]);
  return ok;
}}
/* The least gap (a multiple of 8) at which f returns; -1 if it never does. */
static long long least_gap(entry f) {{
  long long trapped = 0, room = 1 << 16, r;
  if (!returns(f, room, &r)) return -1;
  while (room - trapped > 8) {{
    long long mid = (trapped + room) / 2 / 8 * 8;
    if (returns(f, mid, &r)) room = mid; else trapped = mid;
  }}
  return room;
}}
int main(void) {{
  entry entries[] = {{ plain_2, plain_3, merged_2, merged_3 }};
  for (int i = 0; i < 4; i++) {{
    long long result = 0, none = 0;
    int ok = returns(entries[i], 1 << 16, &result);
    int no_room = returns(entries[i], 0, &none);
    printf(\"%d %lld %d %lld\\n\", ok, result, no_room, least_gap(entries[i]));
  }}
  return 0;
}}"
    )
    .unwrap();
    let source = dir.join("depth.c");
    std::fs::write(&source, c).unwrap();
    let exe = dir.join("depth");
    let output = link_and_run(&tools, &exe, &[&source, &plain.path, &merged.path]);
    let lines: Vec<Vec<i64>> = output
        .lines()
        .map(|l| l.split(' ').map(|w| w.parse().unwrap()).collect())
        .collect();
    assert_eq!(lines.len(), 4);
    // The body's parameters: the constant and the callee.
    let growth = SimilarOptions::default()
        .model
        .stack_growth(&program.functions[0].signature, &[I64, I64]) as i64;
    for member in 0..2 {
        let (p, m) = (&lines[member], &lines[member + 2]);
        assert_eq!((p[0], m[0]), (1, 1), "{target}: member {member} returns");
        assert_eq!(p[1], m[1], "{target}: member {member}'s result");
        assert_eq!(
            (p[2], m[2]),
            (0, 0),
            "{target}: member {member} traps with no room"
        );
        assert!(p[3] > 0 && m[3] > 0, "{target}: {lines:?}");
        assert!(
            m[3] <= p[3] + (DEPTH + 1) * growth,
            "{target}: member {member} needs {} bytes merged, {} plain, {growth} more per level allowed",
            m[3],
            p[3]
        );
    }
    println!("{target}: least room plain and merged {lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn merged_functions_recurse_to_their_stack_limit_on_aarch64() {
    check_stack_depth("aarch64", "aarch64-unknown-linux-gnu");
}

#[test]
fn merged_functions_recurse_to_their_stack_limit_on_x86_64() {
    check_stack_depth("x86_64", "x86_64-unknown-linux-gnu");
}

#[test]
fn aarch64_objects_run_under_qemu_like_the_host_jit() {
    check_target("aarch64", "aarch64-unknown-linux-gnu");
}

#[test]
fn x86_64_objects_run_like_the_host_jit() {
    check_target("x86_64", "x86_64-unknown-linux-gnu");
}

#[test]
fn hand_written_cases_cover_what_they_claim() {
    // The cases file really has tail calls and twelve-argument entries.
    let program = hand_written();
    assert!(
        program
            .functions
            .iter()
            .any(|f| f.signature.call_conv == CallConv::Tail)
    );
    assert!(program.entries.iter().any(|(_, a)| a[0].len() == 12));
    assert!(
        program
            .functions
            .iter()
            .all(|f| f.signature.params.iter().all(|p| p.value_type == I64))
    );
}
