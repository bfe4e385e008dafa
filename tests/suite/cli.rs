//! The `jitfold` command line on the project's own data and on bad input.

use crate::common;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn jitfold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jitfold"))
        .args(args)
        .output()
        .expect("the jitfold binary runs")
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

fn corpus() -> String {
    common::data_dir().join("corpus").display().to_string()
}

#[test]
fn report_groups_the_known_twins() {
    let out = json_of(&jitfold(&["report", "--json", "--groups", &corpus()]));
    // generics.clif: u0:1 and u0:2 are renumbered twins, u0:3 differs in type.
    // stubs.clif: u0:10, u0:11, u0:12 are twins, u0:13 passes another constant.
    assert_eq!(out["files"], 2);
    assert_eq!(out["functions"], 7);
    assert_eq!(out["classes"], 4);
    assert_eq!(out["exact_merged"], 3);
    assert_eq!(out["largest_group"], 3);
    assert_eq!(out["parse_errors"], 0);
    assert_eq!(out["invalid_functions"], 0);
    assert!(out["fingerprint_ns_per_inst"].as_f64().unwrap() > 0.0);
    let groups: Vec<Vec<String>> = out["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            g["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["function"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(
        groups,
        vec![vec!["u0:10", "u0:11", "u0:12"], vec!["u0:1", "u0:2"]]
    );
}

#[test]
fn stable_hash_is_the_same_in_another_process() {
    let out = json_of(&jitfold(&["report", "--json", "--groups", &corpus()]));
    let cli_hash = out["groups"][1]["stable_hash"]
        .as_str()
        .unwrap()
        .to_string();
    let text = std::fs::read_to_string(Path::new(&corpus()).join("generics.clif")).unwrap();
    let funcs = common::parse_valid(&text);
    let here = format!("{:016x}", jitfold::Fingerprint::of(&funcs[0]).stable_hash());
    assert_eq!(cli_hash, here);
    // And the fast hash is keyed per process: it need not match, but two
    // fingerprints of one function in this process agree.
    assert_eq!(
        jitfold::Fingerprint::of(&funcs[0]).fast_hash(),
        jitfold::Fingerprint::of(&funcs[1]).fast_hash()
    );
}

#[test]
fn summary_lists_group_members_by_file() {
    let out = jitfold(&["report", "--groups", &corpus()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("exact_merged          3"), "{text}");
    assert!(text.contains("stubs.clif u0:11"), "{text}");
    assert!(text.contains("generics.clif u0:2"), "{text}");
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("jitfold-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn bad_files_are_reported_and_skipped() {
    let dir = temp_dir("bad");
    std::fs::write(dir.join("broken.clif"), "function %f( {\n").unwrap();
    std::fs::write(
        dir.join("old.clif"),
        "test compile\ntarget i686\nfunction %f() {\nblock0:\n  return\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("invalid.clif"),
        "function %bad(i32) -> i64 {\nblock0(v0: i32):\n  return v0\n}\nfunction %good(i32) -> i32 {\nblock0(v0: i32):\n  return v0\n}\n",
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), "not clif").unwrap();
    let out = json_of(&jitfold(&["report", "--json", dir.to_str().unwrap()]));
    assert_eq!(out["files"], 3);
    assert_eq!(out["parse_errors"], 1);
    assert!(
        out["parse_error_list"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("broken.clif")
    );
    assert_eq!(out["skipped_unsupported"], 1);
    assert!(
        out["skipped_unsupported_list"][0]["message"]
            .as_str()
            .unwrap()
            .contains("i686")
    );
    assert_eq!(out["invalid_functions"], 1);
    assert_eq!(out["invalid_function_list"][0]["function"], "%bad");
    assert_eq!(out["functions"], 1);

    // --strict turns the parse error into a failure, still printing the report.
    let strict = jitfold(&["report", "--json", "--strict", dir.to_str().unwrap()]);
    assert_eq!(strict.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&strict.stderr).contains("failed to parse"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_and_empty_inputs_are_clear_errors() {
    let missing = jitfold(&["report", "/nonexistent/jitfold/path"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such file or directory"));

    let dir = temp_dir("empty");
    let empty = jitfold(&["report", dir.to_str().unwrap()]);
    assert_eq!(empty.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no .clif files found"));

    let none = jitfold(&["report"]);
    assert_eq!(none.status.code(), Some(2));

    let bad_isa = jitfold(&["report", "--isa", "i686", &corpus()]);
    assert_eq!(bad_isa.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_isa.stderr).contains("no backend"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compile_and_verify_on_the_known_twins() {
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--compile",
        "--verify",
        "--isa",
        "x86_64",
        &corpus(),
    ]));
    let c = &out["compile"];
    assert_eq!(c["functions"], 7);
    assert_eq!(c["compile_errors"], 0);
    let (base, dedup) = (
        c["baseline_code_bytes"].as_u64().unwrap(),
        c["dedup_code_bytes"].as_u64().unwrap(),
    );
    // Three of seven functions are duplicates, so dedup emits strictly less.
    assert!(dedup < base && dedup > 0, "{base} {dedup}");
    assert!(c["baseline_s"].as_f64().unwrap() > 0.0);
    // u0:11 and u0:12 against u0:10, u0:2 against u0:1.
    assert_eq!(out["verify"]["pairs"], 3);
    assert_eq!(out["verify"]["mismatches"], 0);

    // Functions that cannot be compiled for the ISA are listed, not fatal.
    let dir = temp_dir("compile-errors");
    std::fs::write(
        dir.join("x86_only.clif"),
        "test compile\ntarget x86_64\nfunction %f(i8x16, i8x16) -> i8x16 {\nblock0(v0: i8x16, v1: i8x16):\n  v2 = x86_pshufb v0, v1\n  return v2\n}\nfunction %g(i64) -> i64 {\nblock0(v0: i64):\n  return v0\n}\n",
    )
    .unwrap();
    let out = jitfold(&[
        "report",
        "--json",
        "--compile",
        "--isa",
        "aarch64",
        dir.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    let out = json_of(&out);
    assert_eq!(out["functions"], 2);
    assert_eq!(out["compile"]["functions"], 1);
    assert_eq!(out["compile"]["compile_errors"], 1);
    assert_eq!(out["compile"]["compile_error_list"][0]["function"], "%f");
}

#[test]
fn reuse_counts_and_verifies_template_twins() {
    let dir = common::data_dir().join("reuse").display().to_string();
    let plain = json_of(&jitfold(&["report", "--json", &dir]));
    assert_eq!(plain["classes"], 3);
    assert!(plain.get("reused").is_none(), "`reused` only with --reuse");
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--reuse",
        "--compile",
        "--verify",
        "--isa",
        "x86_64",
        &dir,
    ]));
    // u0:31 reuses u0:30's code; u0:32's call is not colocated.
    assert_eq!(out["classes"], 3);
    assert_eq!(out["reused"], 1);
    assert_eq!(out["compile"]["functions"], 3);
    assert_eq!(out["verify"]["pairs"], 0);
    assert_eq!(out["verify"]["reuse_pairs"], 1);
    assert_eq!(out["verify"]["reuse_mismatches"], 0);
    // The exact-duplicate figures are unchanged by --reuse.
    let corpus_plain = json_of(&jitfold(&["report", "--json", &corpus()]));
    let corpus_reuse = json_of(&jitfold(&["report", "--json", "--reuse", &corpus()]));
    assert_eq!(corpus_plain["exact_merged"], corpus_reuse["exact_merged"]);
    assert_eq!(corpus_reuse["reused"], 0);
}

#[test]
fn merge_calls_merges_recursive_twins_but_not_address_identities() {
    let dir = common::data_dir().join("calls").display().to_string();
    let exact = json_of(&jitfold(&["report", "--json", &dir]));
    assert_eq!(exact["functions"], 8);
    assert_eq!(
        exact["exact_merged"], 0,
        "twins that call themselves by name"
    );
    assert!(
        exact.get("refined_merged").is_none(),
        "only with --merge calls"
    );
    let calls = json_of(&jitfold(&["report", "--json", "--merge", "calls", &dir]));
    // u0:2 into u0:1, and u0:5/u0:6 into u0:3/u0:4; u0:7 and u0:8 return
    // their own addresses and stay apart.
    assert_eq!(calls["exact_merged"], 0);
    assert_eq!(calls["refined_merged"], 3);
    // Nothing splits: u0:7 and u0:8 only name themselves as data (outside
    // names), so they are never candidates; one round finds it stable.
    assert_eq!(calls["refine_rounds"], 1);
    assert!(calls["refine_s"].as_f64().unwrap() >= 0.0);
    // `--merge exact` is the default and keeps today's numbers.
    let explicit = json_of(&jitfold(&["report", "--json", "--merge", "exact", &dir]));
    assert_eq!(explicit["classes"], exact["classes"]);
    assert!(explicit.get("refined_merged").is_none());
}

#[test]
fn runtests_reports_every_mode_and_passes_what_plain_passes() {
    let dir = common::data_dir().join("runtests").display().to_string();
    let r = json_of(&jitfold(&["runtests", "--json", &dir]));
    assert_eq!(r["run_files"], 9);
    assert_eq!(r["units"], 7);
    assert_eq!(r["run_lines"], 20, "18 in parsed files, 2 in newer.clif");
    let modes = r["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 1 + jitfold::runtests::modes().len());
    assert_eq!(modes[0]["mode"], "plain");
    for m in modes {
        assert_eq!(m["passed"], 14, "{}", m["mode"]);
        assert_eq!(m["failed"], 1, "{}", m["mode"]);
        assert_eq!(
            m["skipped"]["file does not parse with cranelift-reader 0.135.8"], 2,
            "{}",
            m["mode"]
        );
    }
    for m in &modes[1..] {
        assert_eq!(m["regressions"].as_array().unwrap().len(), 0);
        assert_eq!(m["merged_across_files"], 1, "{}", m["mode"]);
    }
    let missing = jitfold(&["runtests", "no/such/dir"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such file"));
}

#[test]
fn compile_for_aarch64_names_what_cannot_be_compiled_and_why() {
    let dir = temp_dir("aarch64");
    std::fs::write(
        dir.join("mixed.clif"),
        "function %shuffle(i8x16, i8x16) -> i8x16 {\nblock0(v0: i8x16, v1: i8x16):\n    v2 = x86_pshufb v0, v1\n    return v2\n}\n\n\
         function %add(i64, i64) -> i64 {\nblock0(v0: i64, v1: i64):\n    v2 = iadd v0, v1\n    return v2\n}\n",
    )
    .unwrap();
    let path = dir.display().to_string();
    let c = json_of(&jitfold(&[
        "report",
        "--json",
        "--isa",
        "aarch64",
        "--compile",
        &path,
    ]))["compile"]
        .clone();
    assert!(
        c["isa"].as_str().unwrap().starts_with("aarch64"),
        "{}",
        c["isa"]
    );
    assert_eq!(c["functions"], 1);
    assert_eq!(c["compile_errors"], 1);
    assert_eq!(c["compile_error_list"][0]["function"], "%shuffle");
    assert_eq!(
        c["compile_error_reasons"][0]["reason"],
        "no lowering for `x86_pshufb` on this ISA"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `report --merge similar --compile` measures the groups even when there
/// are none (as on corpora whose functions all have a stack limit): the
/// JSON has `similar.measured`, with 0 groups and no errors, that `.ci/run`
/// reads.
#[test]
fn similar_measured_is_reported_without_groups() {
    let dir = temp_dir("no-groups");
    std::fs::write(dir.join("one.clif"), constant_function("one", 1)).unwrap();
    let path = dir.display().to_string();
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--merge",
        "similar",
        "--compile",
        &path,
    ]));
    let measured = &out["similar"]["measured"];
    assert_eq!(measured["groups"], 0, "{out}");
    assert_eq!(
        measured["errors"].as_array().map(Vec::len),
        Some(0),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `name() -> i32` returning `value`.
fn constant_function(name: &str, value: i32) -> String {
    format!(
        "function %{name}() -> i32 {{\nblock0:\n    v0 = iconst.i32 {value}\n    return v0\n}}\n"
    )
}

#[test]
fn report_never_groups_functions_of_other_flags_or_targets() {
    let dir = temp_dir("isa-flags");
    let body = constant_function("f", 7);
    std::fs::write(dir.join("a.clif"), &body).unwrap();
    std::fs::write(dir.join("b.clif"), format!("set opt_level=speed\n{body}")).unwrap();
    std::fs::write(dir.join("c.clif"), &body).unwrap();
    std::fs::write(dir.join("d.clif"), format!("target x86_64\n{body}")).unwrap();
    std::fs::write(dir.join("e.clif"), format!("target x86_64 has_avx\n{body}")).unwrap();
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--groups",
        "--reuse",
        "--merge",
        "calls",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(out["functions"], 5);
    // Only a.clif and c.clif (no `set`, no `target`) are one class.
    assert_eq!(out["classes"], 4, "{out}");
    assert_eq!(out["exact_merged"], 1);
    assert_eq!(out["reused"], 0);
    assert_eq!(out["refined_merged"], 0);
    let members = &out["groups"][0]["members"];
    assert!(members[0]["file"].as_str().unwrap().ends_with("a.clif"));
    assert!(members[1]["file"].as_str().unwrap().ends_with("c.clif"));
}

#[test]
fn report_keeps_test_case_names_local_to_their_file() {
    let dir = temp_dir("local-names");
    let caller = "function %f() -> i32 {\n    fn0 = %g() -> i32\nblock0:\n    v0 = call fn0()\n    return v0\n}\n";
    // Each file's %f calls its own %g; one.clif's and three.clif's %g agree.
    for (file, value) in [("one.clif", 1), ("two.clif", 2), ("three.clif", 1)] {
        std::fs::write(
            dir.join(file),
            format!("{}{caller}", constant_function("g", value)),
        )
        .unwrap();
    }
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--groups",
        "--merge",
        "calls",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(out["functions"], 6);
    // Exact: only the two %g returning 1. The %f are not equal by name.
    assert_eq!(out["exact_merged"], 1, "{out}");
    assert_eq!(out["groups"][0]["members"][0]["function"], "%g");
    // By call graph: one.clif's and three.clif's %f call equal functions.
    assert_eq!(out["refined_merged"], 1, "{out}");
}

/// A FIFO named `name` in `dir`, and a thread that, each time a reader
/// opens it, writes `text` (it waits for ever if none does).
fn fifo_with_writer(dir: &Path, name: &str, text: &'static str) -> std::path::PathBuf {
    let fifo = dir.join(name);
    let status = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
    let path = fifo.clone();
    std::thread::spawn(move || {
        while let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(&path) {
            use std::io::Write;
            let _ = f.write_all(text.as_bytes());
        }
    });
    fifo
}

#[test]
fn fifos_are_skipped_with_a_note_never_opened() {
    // If a command opened the FIFO, the writer would feed it a run file
    // with a passing line, and the counts below would change.
    const TEXT: &str = "test run\nfunction %f() -> i32 {\nblock0:\n    v0 = iconst.i32 1\n    return v0\n}\n; run: %f() == 1\n";
    let dir = temp_dir("fifo");
    std::fs::write(dir.join("real.clif"), constant_function("f", 3)).unwrap();
    fifo_with_writer(&dir, "pipe.clif", TEXT);
    let out = jitfold(&["report", "--json", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = json_of(&out);
    assert_eq!(report["files"], 1, "{report}");
    assert_eq!(report["skipped_files"], 1);
    assert!(
        report["skipped_file_list"][0]["message"]
            .as_str()
            .unwrap()
            .contains("FIFO")
    );
    assert!(stderr.contains("pipe.clif: a FIFO"), "{stderr}");

    let out = jitfold(&["runtests", "--json", dir.to_str().unwrap()]);
    let runs = json_of(&out);
    assert_eq!(runs["files"], 1, "{runs}");
    assert_eq!(runs["run_files"], 0);
    assert_eq!(runs["skipped_files"].as_array().unwrap().len(), 1);
}

#[test]
fn one_file_reached_by_several_paths_is_counted_once() {
    let dir = temp_dir("spellings");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/x.clif"), constant_function("f", 1)).unwrap();
    std::os::unix::fs::symlink(dir.join("sub/x.clif"), dir.join("link.clif")).unwrap();
    let spelled = dir.join("sub/../sub/x.clif");
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        dir.to_str().unwrap(),
        dir.join("sub").to_str().unwrap(),
        spelled.to_str().unwrap(),
    ]));
    assert_eq!(out["files"], 1, "{out}");
    assert_eq!(out["functions"], 1);
    assert_eq!(out["exact_merged"], 0);
}

#[test]
fn file_names_that_are_not_utf8_are_written_lossily() {
    use std::os::unix::ffi::OsStrExt;
    let dir = temp_dir("not-utf8");
    let name = std::ffi::OsStr::from_bytes(b"bad\xff.clif");
    std::fs::write(dir.join(name), "function %f( {\n").unwrap();
    let out = json_of(&jitfold(&["report", "--json", dir.to_str().unwrap()]));
    assert_eq!(out["parse_errors"], 1);
    let file = out["parse_error_list"][0]["file"].as_str().unwrap();
    assert!(file.ends_with("bad\u{FFFD}.clif"), "{file}");
}

#[test]
fn panics_caught_while_reading_print_nothing() {
    let vector = common::data_dir().join("runtests_bad/vector.clif");
    let out = jitfold(&["runtests", "--json", vector.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let runs = json_of(&out);
    assert_eq!(
        runs["modes"][0]["skipped"]["run line does not parse with cranelift-reader 0.135.8"], 1,
        "{runs}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `--verify` lays twins out in one block order before it calls their code
/// different (one function of the comparison, `compile::compare_compiled_code`):
/// a function whose code depends on its block layout, and its twin in
/// another layout, are one class with no mismatch.
#[test]
fn verify_sees_through_block_layout() {
    let func = common::layout_dependent();
    let other = common::reversed(&func);
    let dir = temp_dir("layout");
    let isa = jitfold::isa::host_isa(jitfold::isa::jit_flags()).unwrap();
    let compile = |f: &cranelift_codegen::ir::Function| {
        jitfold::compile::compile(f, &*isa).unwrap().code.bytes
    };
    assert_ne!(compile(&func), compile(&other), "needs another function");
    for (file, f) in [("a.clif", &func), ("b.clif", &other)] {
        let text = format!(
            "test compile\nset opt_level=speed\nset preserve_frame_pointers=true\ntarget x86_64\n{}",
            f.display()
        );
        std::fs::write(dir.join(file), text).unwrap();
    }
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--verify",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(out["exact_merged"], 1);
    assert_eq!(out["verify"]["pairs"], 1);
    assert_eq!(out["verify"]["mismatches"], 0, "{out}");
}

#[test]
fn similar_finds_the_stub_that_passes_another_constant() {
    // stubs.clif: u0:13 is u0:10 with another constant; the two share a
    // shape, with one parameter, and are too small to pay.
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--groups",
        "--merge",
        "similar",
        "--compile",
        &corpus(),
    ]));
    // `--similar` is the same; `--merge calls,similar` adds the call graph.
    let alias = json_of(&jitfold(&["report", "--json", "--similar", &corpus()]));
    let both = json_of(&jitfold(&[
        "report",
        "--json",
        "--merge",
        "calls,similar",
        &corpus(),
    ]));
    for other in [&alias, &both] {
        assert_eq!(other["similar"]["candidate_groups"], 1, "{other}");
        assert_eq!(other["similar"]["refused_cost"], 1, "{other}");
    }
    assert!(alias.get("refined_merged").is_none());
    assert!(both.get("refined_merged").is_some());
    let s = &out["similar"];
    assert_eq!(s["candidate_groups"], 1);
    assert_eq!(s["param_groups"], 0);
    assert_eq!(s["refused_cost"], 1);
    let group = &s["groups"][0];
    let members: Vec<&str> = group["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["function"].as_str().unwrap())
        .collect();
    assert_eq!(members, ["u0:10", "u0:13"]);
    assert_eq!(group["parameters"], 1);
    assert_eq!(group["decision"], "DoesNotPay");
    // Merged anyway, body and thunks compile, and are larger.
    assert_eq!(s["measured"]["groups"], 1);
    assert_eq!(s["measured"]["errors"].as_array().unwrap().len(), 0);
    assert_eq!(s["measured"]["predicted_right"], 1);
    assert!(group["measured"]["saved"].as_i64().unwrap() < 0);
}

/// `report --compile --cache DIR` (a pack store): a cold run stores what
/// it compiles, a warm run loads every one of them and compiles nothing;
/// an entry whose bytes changed is a miss (the pack's record check), so
/// its function is compiled and stored again, and the others still load.
#[test]
fn report_cache_warm_run_loads_what_the_cold_run_stored() {
    let dir = std::env::temp_dir().join(format!("jitfold-cli-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.display().to_string();
    let run = || {
        let args = [
            "report",
            "--json",
            "--compile",
            "--cache",
            &cache,
            &corpus(),
        ];
        json_of(&jitfold(&args))["compile"].clone()
    };
    let cold = run();
    let stored = cold["cache_stored"].as_u64().unwrap();
    assert!(stored > 0, "{cold}");
    assert_eq!(cold["cache_loaded"], 0);
    let warm = run();
    assert_eq!(warm["cache_loaded"].as_u64().unwrap(), stored, "{warm}");
    assert_eq!(
        (
            warm["cache_stored"].as_u64(),
            warm["cache_rejected"].as_u64()
        ),
        (Some(0), Some(0))
    );
    // The cold run's one pack; the last byte of its last record (a value
    // byte) flipped in place.
    let packs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(packs.len(), 1, "{packs:?}");
    let mut bytes = std::fs::read(&packs[0]).unwrap();
    *bytes.last_mut().unwrap() ^= 0x5a;
    std::fs::write(&packs[0], &bytes).unwrap();
    let after = run();
    assert_eq!(after["cache_rejected"], 0, "{after}");
    assert_eq!(after["cache_stored"], 1, "{after}");
    assert_eq!(after["cache_loaded"].as_u64().unwrap(), stored - 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `report --merge similar` leaves out, as a batch flush does, a function
/// that names a duplicate (the flush rewrites it to name the duplicate's
/// canonical function, and leaves it out: 3 in `module/roots.rs`): `u0:2`
/// calls `u0:1`, an exact duplicate of `u0:0`; `u0:3` and `u0:4`, of its
/// shape, call `u0:0` and stay.
#[test]
fn similar_leaves_out_a_function_naming_a_duplicate() {
    let leaf = |id: u32| {
        format!(
            "function u0:{id}(i64) -> i64 {{\nblock0(v0: i64):\n    v1 = imul v0, v0\n    \
             return v1\n}}\n"
        )
    };
    let caller = |id: u32, callee: u32, k: i64| {
        format!(
            "function u0:{id}(i64) -> i64 {{\n    sig0 = (i64) -> i64\n    \
             fn0 = colocated u0:{callee} sig0\nblock0(v0: i64):\n    v1 = iconst.i64 {k}\n    \
             v2 = iadd v0, v1\n    v3 = call fn0(v2)\n    return v3\n}}\n"
        )
    };
    let dir = temp_dir("similar-names-duplicate");
    let text = format!(
        "test compile\nset opt_level=speed\ntarget x86_64\n{}{}{}{}{}",
        leaf(0),
        leaf(1),
        caller(2, 1, 3),
        caller(3, 0, 5),
        caller(4, 0, 9)
    );
    std::fs::write(dir.join("f.clif"), text).unwrap();
    let out = json_of(&jitfold(&[
        "report",
        "--json",
        "--groups",
        "--merge",
        "similar",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(out["exact_merged"], 1, "{out}");
    assert_eq!(out["similar"]["functions_with_sites"], 2, "{out}");
    let members: Vec<&str> = out["similar"]["groups"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["function"].as_str().unwrap())
        .collect();
    assert_eq!(members, ["u0:3", "u0:4"]);
}

/// `report --merge calls,similar` takes candidates as a batch flush does:
/// a function refinement merges into an earlier one (here `%f1`, the
/// self-recursive twin of `%f0`) is a duplicate, not a member of a group
/// of similar functions; `%f2` (another constant) still is.
#[test]
fn similar_leaves_out_what_refinement_merged() {
    let recursive = |name: &str, k: i64| {
        format!(
            "function %{name}(i64) -> i64 {{\n    sig0 = (i64) -> i64\n    fn0 = colocated %{name} sig0\n\
             block0(v0: i64):\n    v1 = iconst.i64 {k}\n    v2 = iadd v0, v1\n    v3 = call fn0(v2)\n    \
             return v3\n}}\n"
        )
    };
    let dir = temp_dir("similar-refined");
    let text = format!(
        "test compile\nset opt_level=speed\ntarget x86_64\n{}{}{}",
        recursive("f0", 7),
        recursive("f1", 7),
        recursive("f2", 9)
    );
    std::fs::write(dir.join("f.clif"), text).unwrap();
    let report = |merge: &str| {
        json_of(&jitfold(&[
            "report",
            "--json",
            "--groups",
            "--merge",
            merge,
            dir.to_str().unwrap(),
        ]))
    };
    let members = |out: &Value| -> Vec<String> {
        out["similar"]["groups"][0]["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["function"].as_str().unwrap().to_string())
            .collect()
    };
    let alone = report("similar");
    assert_eq!(alone["similar"]["functions_with_sites"], 3, "{alone}");
    assert_eq!(members(&alone), ["%f0", "%f1", "%f2"]);
    let refined = report("calls,similar");
    assert_eq!(refined["refined_merged"], 1, "{refined}");
    assert_eq!(refined["similar"]["functions_with_sites"], 2, "{refined}");
    assert_eq!(members(&refined), ["%f0", "%f2"]);
}
