//! Two processes of a fleet sharing compiled code through a Redis server.
//!
//! ```sh
//! redis-server --port 6390 --save '' --appendonly no &
//! cargo run --example fleet --features redis,tools -- redis://127.0.0.1:6390
//! ```
//!
//! The example starts itself twice, one process after the other, as two
//! instances of a runtime would start: each JITs the built-in demo workload
//! through `DedupModule` in batch mode with a `RedisStore`, signed with a
//! secret both know, calls every function and compares the results with
//! plain `JITModule`. Batch mode asks the server for a whole flush's
//! entries at once (one pipeline of reads), where eager mode asks once per
//! function. The first process compiles what the server does not hold
//! yet; the second compiles nothing and defines every function from the
//! server's entries. With the server down, both compile everything: a
//! store that fails is a miss, never an error.

use jitfold::store::{CodeStore, RedisStore, Secret};
use jitfold::{DedupOptions, demo};
use std::process::{Command, ExitCode};
use std::sync::Arc;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string());
    match args.next().as_deref() {
        Some("--instance") => instance(&url),
        _ => fleet(&url),
    }
}

/// Runs two instances, one after the other.
fn fleet(url: &str) -> ExitCode {
    let exe = std::env::current_exe().expect("the example's own path");
    for n in 1..=2 {
        println!("instance {n}:");
        let status = Command::new(&exe)
            .args([url, "--instance"])
            .status()
            .expect("start an instance");
        if !status.success() {
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

/// One instance: the demo workload through the fleet's store.
fn instance(url: &str) -> ExitCode {
    let store: Arc<dyn CodeStore> = match RedisStore::new(url) {
        Ok(store) => Arc::new(store),
        Err(e) => {
            eprintln!("{url}: {e}");
            return ExitCode::from(2);
        }
    };
    // Both instances know the secret; entries without its MAC are never
    // used (see `jitfold::store` for the trust model).
    let secret = Secret::derive(b"example fleet secret: keep real ones out of source code");
    let runs = demo::compare_with_store(2, 50, &[DedupOptions::batch()], Some(store), Some(secret));
    let runs = match runs {
        Ok(runs) => runs,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let (plain, jitfold) = (&runs[0], &runs[1]);
    println!(
        "  {} functions: {} compiled, {} loaded from {url}, {} reused, {} duplicates; \
         results {} plain JITModule's",
        jitfold.functions,
        jitfold.compiled,
        jitfold.loaded,
        jitfold.reused,
        jitfold.aliased + jitfold.trampolined,
        if jitfold.results == plain.results {
            "equal to"
        } else {
            "DIFFERENT from"
        }
    );
    if jitfold.results == plain.results {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
