//! Table 6: N runtimes starting one program at once. Each wasm corpus is
//! defined by N threads at once, each a runtime with its own module: N
//! plain `JITModule`s (each compiles everything) against N
//! `DedupModule<JITModule>`s sharing one `SharedStore` (which divide the
//! compiles, see 7 and 8 in `src/module/stored.rs`), in eager and batch
//! mode, for N = 2 and the machine's core count, with Cranelift's
//! verifier on and off. Each cell is the best wall time over the rounds
//! (plain and shared alternate within a round); the compiles are summed
//! over the N runtimes.
//!
//! `JITFOLD_COMPARE=runtimes cargo bench --features tools --bench
//! compare` prints this table alone, on whole corpora.

use crate::e2e::{Corpus, Persistent, Way, Workload, run};
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

/// The host ISA with `jitfold::isa::jit_flags()`'s settings and the
/// verifier on or off.
fn isa(verifier: bool) -> OwnedTargetIsa {
    let flags = jitfold::isa::flags(&[
        ("opt_level", "speed"),
        ("preserve_frame_pointers", "true"),
        ("enable_verifier", if verifier { "true" } else { "false" }),
    ])
    .expect("settings exist");
    jitfold::isa::host_isa(flags).expect("host ISA")
}

/// `n` runtimes defining `w` at once, each its own module, each the way
/// `store` says (`None`: plain). The wall time and the compiles summed
/// over the runtimes (plain: every function, each time).
fn runtimes(
    n: usize,
    w: &Workload,
    isa: &OwnedTargetIsa,
    jitfold: Option<(DedupOptions, Arc<SharedStore>)>,
) -> (Duration, u64) {
    let start = Instant::now();
    let compiles = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let jitfold = jitfold.clone();
                s.spawn(move || match jitfold {
                    Some((options, store)) => {
                        let store = store as Arc<dyn CodeStore>;
                        let r = run(
                            Way::Jitfold(options, ""),
                            w,
                            isa,
                            Persistent::Jitfold(store),
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
    let modes = [
        ("eager", DedupOptions::eager()),
        ("batch", DedupOptions::batch()),
    ];
    let mut rows = Vec::new();
    for verifier in [true, false] {
        let isa = isa(verifier);
        for corpus in corpora.iter().filter(|c| c.wasm) {
            let w = Workload::of_corpus(corpus, &*isa, config.corpus_limit);
            for &n in &counts {
                eprintln!(
                    "runtimes: {} x{n}, verifier {verifier} ({rounds} rounds)",
                    w.name
                );
                let mut plain = Duration::MAX;
                let mut shared = [Duration::MAX; 2];
                let mut compiles = [0; 2];
                let mut plain_compiles = 0;
                for _ in 0..rounds {
                    let (time, c) = runtimes(n, &w, &isa, None);
                    plain = plain.min(time);
                    plain_compiles = c;
                    for (i, (_, options)) in modes.iter().enumerate() {
                        let store = Arc::new(SharedStore::new());
                        let (time, c) = runtimes(n, &w, &isa, Some((*options, store)));
                        shared[i] = shared[i].min(time);
                        compiles[i] = c;
                    }
                }
                for (i, (label, _)) in modes.iter().enumerate() {
                    rows.push(vec![
                        w.name.clone(),
                        if verifier { "on" } else { "off" }.into(),
                        n.to_string(),
                        label.to_string(),
                        format!("{plain_compiles} → {}", compiles[i]),
                        ms(plain),
                        ms(shared[i]),
                        format!("{:.2}x", plain.as_secs_f64() / shared[i].as_secs_f64()),
                    ]);
                }
            }
        }
    }
    println!(
        "### 6. N runtimes starting one program at once\n\n\
         N threads each define a whole corpus ({}) in a runtime of their own and finalize it: \
         N plain `JITModule`s against N `DedupModule<JITModule>`s on one `SharedStore`. \
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
