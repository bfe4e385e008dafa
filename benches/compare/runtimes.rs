//! Table 6: N runtimes starting one program at once. Each wasm corpus is
//! defined by N threads at once, each a runtime with its own module: N
//! plain `JITModule`s (each compiles everything) against N
//! `DedupModule<JITModule>`s sharing one `SharedStore` (which divide the
//! compiles, see 7 and 8 in `src/module/stored.rs`), in eager and batch
//! mode, and N modules each with a `RedisStore` of its own on one
//! `redis-server` (as N processes are: leases divide the compiles), for N = 2 and the machine's core count, with Cranelift's
//! verifier on and off. Each cell is the best wall time over the rounds
//! (plain and shared alternate within a round); the compiles are summed
//! over the N runtimes.
//!
//! `JITFOLD_COMPARE=runtimes cargo bench --features tools --bench
//! compare` prints this table alone, on whole corpora.

use crate::e2e::{Corpus, Persistent, Way, Workload, fleet, run};
use crate::{Config, ms, table};
use cranelift_codegen::isa::OwnedTargetIsa;
use jitfold::DedupOptions;
use jitfold::store::{CodeStore, SharedStore};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds of each comparison (`JITFOLD_RUNTIMES_ROUNDS`, 3 unless set).
fn rounds() -> usize {
    std::env::var("JITFOLD_RUNTIMES_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
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
                    Some((options, store)) => {
                        let r = run(
                            Way::Jitfold(options, ""),
                            w,
                            isa,
                            Persistent::Jitfold(store()),
                        );
                        r.stats.map_or(0, |s| s.compiled)
                    }
                    None => {
                        run(Way::Plain, w, isa, Persistent::None);
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
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut counts = vec![2];
    if cores > 2 {
        counts.push(cores);
    }
    let rounds = rounds();
    let server = fleet::Server::start();
    let modes = [
        ("eager", DedupOptions::eager(), false),
        ("batch", DedupOptions::batch(), false),
        ("batch, Redis", DedupOptions::batch(), true),
    ];
    let mut rows = Vec::new();
    let mut round = 0;
    for verifier in [true, false] {
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
            }
        }
    }
    println!(
        "### 6. N runtimes starting one program at once\n\n\
         N threads each define a whole corpus ({}) in a runtime of their own and finalize it: \
         N plain `JITModule`s against N `DedupModule<JITModule>`s on one `SharedStore`, or, \
         `batch, Redis`, each with a `RedisStore` of its own on one `redis-server` on loopback \
         (as N processes would be: leases divide the compiles). \
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
