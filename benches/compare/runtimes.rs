//! Table 6: N runtimes starting one program at once. Each wasm corpus is
//! defined by N threads at once, each a runtime with its own module: N
//! plain `JITModule`s (each compiles everything) against N
//! `DedupModule<JITModule>`s sharing one `SharedStore` (which divide the
//! compiles, see 7 and 8 in `src/module/stored.rs`), in eager and batch
//! mode, and N modules each with a `RedisStore` of its own on one
//! `redis-server` (as N processes are: leases divide the compiles), and N
//! processes on that server against N plain processes, for N = 2 and the
//! machine's core count, with Cranelift's verifier on and off. Each cell
//! is the best wall time over the rounds (plain and shared alternate
//! within a round); the compiles are summed over the N runtimes. A runtime
//! process that hangs hangs the bench (nothing times it out).
//!
//! `JITFOLD_COMPARE=runtimes cargo bench --features tools,redis --bench
//! compare` prints this table alone, on whole corpora (without the
//! `redis` feature, or without `redis-server`, no Redis rows);
//! `JITFOLD_RUNTIMES_ROUNDS` sets the rounds, `JITFOLD_RUNTIMES_N` the
//! numbers of runtimes (a comma list) and `JITFOLD_RUNTIMES_VERIFIER`
//! (`on` or `off`) one verifier setting.

use crate::e2e::{Corpus, Funcs, Persistent, Way, Workload, fleet, run_with};
use crate::{Config, ms, table};
use cranelift_codegen::isa::OwnedTargetIsa;
use jitfold::DedupOptions;
use jitfold::store::{CodeStore, SharedStore};
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in a process this bench starts as one runtime of the `processes`
/// rows: the corpus's folder name. The others: `JITFOLD_RUNTIME_VERIFIER`
/// (`on` or `off`), `JITFOLD_RUNTIME_REDIS` (the server's URL; unset: a
/// plain runtime) and `JITFOLD_RUNTIME_KEYS` (the keys' prefix).
const CHILD_CORPUS: &str = "JITFOLD_RUNTIME_CORPUS";

/// One runtime in a process of its own (see [`CHILD_CORPUS`]), if this
/// process is one: it loads its corpus, says `ready`, waits for a line on
/// its standard input, defines the whole program (plain, or in batch mode
/// on the Redis server) and says `done` and its compiles. Returns whether
/// it was.
pub fn run_as_child(config: &Config) -> bool {
    let Some(corpus) = std::env::var_os(CHILD_CORPUS) else {
        return false;
    };
    let verifier = std::env::var("JITFOLD_RUNTIME_VERIFIER").is_ok_and(|v| v == "on");
    let redis = std::env::var("JITFOLD_RUNTIME_REDIS").ok();
    let keys = std::env::var("JITFOLD_RUNTIME_KEYS").unwrap_or_default();
    let dir = crate::common::corpus_dirs()
        .into_iter()
        .find(|d| d.file_name() == Some(&corpus))
        .expect("the corpus the parent named");
    let isa = crate::isa_with_verifier(verifier);
    let corpus = Corpus::load(&dir, &*isa);
    let w = Workload::of_corpus(&corpus, &*isa, config.corpus_limit);
    // Copied before the start (the threads' runtimes copy theirs inside
    // the wall time, plain and jitfold alike).
    let funcs = w.funcs.clone();
    let mut out = std::io::stdout();
    writeln!(out, "ready")
        .and_then(|()| out.flush())
        .expect("parent reads");
    // Anything but `go` (the parent ended: its end of the pipe closed)
    // ends this process without running.
    let mut go = String::new();
    if std::io::stdin().read_line(&mut go).is_err() || go.trim() != "go" {
        std::process::exit(1);
    }
    let compiles = match redis {
        Some(url) => {
            let store = fleet::store_at(&url, &keys);
            let r = run_with(
                Way::Jitfold(DedupOptions::batch(), ""),
                &w,
                Funcs::Copied(funcs),
                &isa,
                Persistent::Jitfold(store),
            );
            r.stats.map_or(0, |s| s.compiled)
        }
        None => {
            run_with(Way::Plain, &w, Funcs::Copied(funcs), &isa, Persistent::None);
            w.funcs.len() as u64
        }
    };
    writeln!(out, "done {compiles}")
        .and_then(|()| out.flush())
        .expect("parent reads");
    true
}

/// `n` runtimes defining `corpus` at once, each a process of its own (this
/// bench again, see [`run_as_child`]), started together once every one
/// has loaded the corpus: in batch mode on the Redis server at `redis`
/// (URL, keys' prefix), or plain where `None`. The wall time from the
/// start to the last `done`, and the compiles summed.
fn processes(
    n: usize,
    corpus: &str,
    verifier: bool,
    redis: Option<(&str, &str)>,
) -> (Duration, u64) {
    let exe = std::env::current_exe().expect("this bench's path");
    // Killed if this function panics (see `Runtimes`).
    let mut children = Runtimes(Vec::with_capacity(n));
    children.0.extend((0..n).map(|_| {
        let mut command = Command::new(&exe);
        command
            .env(CHILD_CORPUS, corpus)
            .env(
                "JITFOLD_RUNTIME_VERIFIER",
                if verifier { "on" } else { "off" },
            )
            .env_remove("JITFOLD_RUNTIME_REDIS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some((url, keys)) = redis {
            command
                .env("JITFOLD_RUNTIME_REDIS", url)
                .env("JITFOLD_RUNTIME_KEYS", keys);
        }
        let mut child = command.spawn().expect("the bench starts itself");
        let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        (child, lines)
    }));
    let next_line = |lines: &mut Lines<BufReader<ChildStdout>>| {
        lines
            .next()
            .expect("a runtime process ended early")
            .expect("its output reads")
    };
    for (_, lines) in &mut children.0 {
        assert_eq!(next_line(lines), "ready");
    }
    let start = Instant::now();
    for (child, _) in &mut children.0 {
        let stdin = child.stdin.as_mut().expect("piped");
        writeln!(stdin, "go").expect("the runtime reads");
    }
    let mut compiles = 0;
    for (_, lines) in &mut children.0 {
        let done = next_line(lines);
        let count = done.strip_prefix("done ").expect("`done` and its compiles");
        compiles += count.parse::<u64>().expect("a count");
    }
    let time = start.elapsed();
    for (child, _) in &mut children.0 {
        assert!(child.wait().expect("the runtime ends").success());
    }
    (time, compiles)
}

/// The runtime processes of [`processes`], with what they print; any
/// still running when this drops (the bench panicked) are killed.
struct Runtimes(Vec<(Child, Lines<BufReader<ChildStdout>>)>);

impl Drop for Runtimes {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Rounds of each comparison (`JITFOLD_RUNTIMES_ROUNDS`, 3 unless set).
fn rounds() -> usize {
    std::env::var("JITFOLD_RUNTIMES_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// The numbers of runtimes measured: `JITFOLD_RUNTIMES_N` (a comma list,
/// such as `16`), else 2 and the machine's core count.
fn counts() -> Vec<usize> {
    if let Ok(list) = std::env::var("JITFOLD_RUNTIMES_N") {
        let counts: Vec<usize> = list
            .split(',')
            .map(|n| n.trim().parse().expect("JITFOLD_RUNTIMES_N: numbers"))
            .collect();
        assert!(!counts.contains(&0), "JITFOLD_RUNTIMES_N: no runtimes");
        return counts;
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut counts = vec![2];
    if cores > 2 {
        counts.push(cores);
    }
    counts
}

/// The verifier settings measured: `JITFOLD_RUNTIMES_VERIFIER` (`on` or
/// `off`), else both.
fn verifier_settings() -> Vec<bool> {
    match std::env::var("JITFOLD_RUNTIMES_VERIFIER").as_deref() {
        Ok("on") => vec![true],
        Ok("off") => vec![false],
        Ok(other) => panic!("JITFOLD_RUNTIMES_VERIFIER: `on` or `off`, not `{other}`"),
        Err(_) => vec![true, false],
    }
}

/// What gives each runtime its store.
type StoreOf<'a> = dyn Fn() -> Arc<dyn CodeStore> + Sync + 'a;

/// `n` runtimes defining `w` at once, each its own module: with `options`
/// and a store from `store` (each runtime calls it once), or plain where
/// `jitfold` is `None`. The wall time and the compiles summed over the
/// runtimes (plain: every function, each time).
fn runtimes(
    n: usize,
    w: &Workload,
    isa: &OwnedTargetIsa,
    jitfold: Option<(DedupOptions, &StoreOf<'_>)>,
) -> (Duration, u64) {
    let start = Instant::now();
    let compiles = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(move || match jitfold {
                    // Each runtime copies the whole program first, inside
                    // the wall time, plain or not.
                    Some((options, store)) => {
                        let r = run_with(
                            Way::Jitfold(options, ""),
                            w,
                            Funcs::Copied(w.funcs.clone()),
                            isa,
                            Persistent::Jitfold(store()),
                        );
                        r.stats.map_or(0, |s| s.compiled)
                    }
                    None => {
                        let funcs = Funcs::Copied(w.funcs.clone());
                        run_with(Way::Plain, w, funcs, isa, Persistent::None);
                        w.funcs.len() as u64
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a runtime panicked"))
            .sum()
    });
    (start.elapsed(), compiles)
}

/// Prints table 6 (see the file's docs).
pub fn print(corpora: &[Corpus], config: &Config) {
    let counts = counts();
    let rounds = rounds();
    let server = fleet::Server::start();
    let modes = [
        ("eager", DedupOptions::eager(), false),
        ("batch", DedupOptions::batch(), false),
        ("batch, Redis", DedupOptions::batch(), true),
    ];
    let mut rows = Vec::new();
    let mut round = 0;
    for verifier in verifier_settings() {
        let isa = crate::isa_with_verifier(verifier);
        for corpus in corpora.iter().filter(|c| c.wasm) {
            let w = Workload::of_corpus(corpus, &*isa, config.corpus_limit);
            for &n in &counts {
                eprintln!(
                    "runtimes: {} x{n}, verifier {verifier} ({rounds} rounds)",
                    w.name
                );
                let mut plain = Duration::MAX;
                let mut best = [Duration::MAX; 3];
                let mut compiles = [0; 3];
                let mut plain_compiles = 0;
                for _ in 0..rounds {
                    let (time, c) = runtimes(n, &w, &isa, None);
                    plain = plain.min(time);
                    plain_compiles = c;
                    for (i, (_, options, redis)) in modes.iter().enumerate() {
                        round += 1;
                        let shared = Arc::new(SharedStore::new());
                        // Each runtime its own store: threads on one
                        // `SharedStore`, or Redis clients of their own (as
                        // processes are), on keys no earlier run wrote.
                        let prefix = format!("runtimes:{round}:");
                        let store_of = || -> Arc<dyn CodeStore> {
                            match (&server, redis) {
                                (Some(server), true) => server.store(&prefix),
                                _ => shared.clone(),
                            }
                        };
                        if *redis && server.is_none() {
                            continue;
                        }
                        let (time, c) = runtimes(n, &w, &isa, Some((*options, &store_of)));
                        best[i] = best[i].min(time);
                        compiles[i] = c;
                    }
                }
                // As processes, through Redis: N plain processes against
                // N processes in batch mode on the server.
                let mut in_processes = None;
                if let Some(server) = &server {
                    let mut plain = (Duration::MAX, 0);
                    let mut on_redis = (Duration::MAX, 0);
                    for _ in 0..rounds {
                        let (time, c) = processes(n, &corpus.name, verifier, None);
                        plain = (plain.0.min(time), c);
                        round += 1;
                        let keys = format!("runtimes:{round}:");
                        let (time, c) =
                            processes(n, &corpus.name, verifier, Some((server.url(), &keys)));
                        on_redis = (on_redis.0.min(time), c);
                    }
                    in_processes = Some((plain, on_redis));
                }
                let first = rows.len();
                for (i, (label, _, redis)) in modes.iter().enumerate() {
                    let measured = !*redis || server.is_some();
                    rows.push(vec![
                        w.name.clone(),
                        if verifier { "on" } else { "off" }.into(),
                        n.to_string(),
                        label.to_string(),
                        if measured {
                            format!("{plain_compiles} → {}", compiles[i])
                        } else {
                            fleet::MISSING.to_string()
                        },
                        ms(plain),
                        if measured { ms(best[i]) } else { "-".into() },
                        if measured {
                            format!("{:.2}x", plain.as_secs_f64() / best[i].as_secs_f64())
                        } else {
                            "-".into()
                        },
                    ]);
                }
                if let Some(((plain, plain_compiles), (best, compiles))) = in_processes {
                    rows.push(vec![
                        w.name.clone(),
                        if verifier { "on" } else { "off" }.into(),
                        n.to_string(),
                        "batch, Redis, processes".into(),
                        format!("{plain_compiles} → {compiles}"),
                        ms(plain),
                        ms(best),
                        format!("{:.2}x", plain.as_secs_f64() / best.as_secs_f64()),
                    ]);
                }
                // Each row as soon as it is measured, in case the run is
                // cut short.
                for row in &rows[first..] {
                    eprintln!("runtimes: | {} |", row.join(" | "));
                }
            }
        }
    }
    println!(
        "### 6. N runtimes starting one program at once\n\n\
         N threads each define a whole corpus ({}) in a runtime of their own and finalize it: \
         N plain `JITModule`s against N `DedupModule<JITModule>`s on one `SharedStore`, or, \
         `batch, Redis`, each with a `RedisStore` of its own on one `redis-server` on loopback \
         (as N processes would be: leases divide the compiles); `batch, Redis, processes`: \
         N processes each a runtime (this bench started again; each loads the corpus, then all \
         start at once) against N plain processes. \
         Wall time, best of {rounds} rounds; compiles summed over the N runtimes; speedup = \
         plain / shared.\n",
        config
            .corpus_limit
            .map_or("every function that compiles".to_string(), |l| format!(
                "the first {l} functions"
            ))
    );
    table(
        &[
            "corpus",
            "verifier",
            "N",
            "mode",
            "compiles, plain → shared",
            "N plain (ms)",
            "N on one store (ms)",
            "speedup",
        ],
        &rows,
    );
}
