//! Check 7 of the differential check: code that comes through a code
//! store runs as compiled code does.
//!
//! The other checks define a program in one module with no store, so the
//! one load path (an entry's code copied in and relocated by slot for the
//! function that loads it) and the protocol by which modules on one store
//! divide their compiles (claims, a definition eager mode leaves to the
//! flush and keeps as it was, waiting for another module's entry) would
//! otherwise be tested only by hand-written cases.
//!
//! # What this module guarantees
//!
//! [`check`] returns `Err` (with a description) exactly when a call of a
//! function of the program gives another result (or traps otherwise) than
//! under plain `JITModule`, through a `DedupModule<JITModule>` on a new
//! [`SharedStore`] that:
//!
//! 1. **loads**: defines the program after another module, with the same
//!    options, defined it on that store (so each function's code is the
//!    entry the first module stored for its template, or code it reuses),
//!    in batch mode, with
//!    [similar-function merging](super::differential::similar_options),
//!    and in eager mode on a store with no room (a limit of 0 bytes: each
//!    of its 64 parts keeps only the entry put last, so where two of the
//!    program's templates fall in one part, the second module may load
//!    one, and compiles the others again);
//!    the first module's calls are compared too;
//! 2. **divides**: defines the program at the same time as another module
//!    on the store, each on a thread of its own (each compiles the
//!    templates the other has not claimed, and loads, or in eager mode
//!    leaves to its flush, those the other is compiling), in eager and in
//!    batch mode; both modules' calls are compared.
//!
//! A module whose definitions or finalization fail, or a thread that
//! panics, fails the check likewise. Calls run as in the rest of the check
//! (in child processes, [`super::isolated`]).

use super::differential::{
    Outcome, call_all, define_all, jit_builder, same_results, similar_options,
};
use super::program::Program;
use crate::store::{CodeStore, SharedStore};
use crate::{DedupModule, DedupOptions};
use cranelift_jit::JITModule;
use std::sync::Arc;
use std::sync::mpsc;

/// Runs checks 1 and 2 of the module docs on `program`, whose calls return
/// `expected` under plain `JITModule`; notes in `outcome` how many
/// functions a module defined from the store.
pub(super) fn check(
    program: &Program,
    expected: &[Option<i64>],
    outcome: &mut Outcome,
) -> Result<(), String> {
    for (options, limit) in [
        (DedupOptions::eager(), Some(0)),
        (DedupOptions::batch(), None),
        (similar_options(), None),
    ] {
        let store: Arc<dyn CodeStore> = Arc::new(match limit {
            Some(limit) => SharedStore::new().with_limit(limit),
            None => SharedStore::new(),
        });
        let room = limit.map_or(String::new(), |limit| format!(" of {limit} bytes"));
        for run in ["filling", "loading"] {
            let how = format!("{options}, {run} a store{room}");
            let (mut module, pointers) = defined(program, options, &store, &how)?;
            let got = call_all(program, &pointers).map_err(|e| format!("{how}: {e}"));
            // The entries of what it compiled are all in the store when it
            // is dropped; they are waited for here, before the next run.
            module.wait_for_store_writes();
            let stats = module.stats();
            outcome.loaded = outcome.loaded.max(stats.loaded as usize);
            if limit.is_some() && run == "loading" {
                outcome.loaded_without_room = stats.loaded as usize;
                outcome.compiled_without_room = stats.compiled as usize;
            }
            // SAFETY: no pointer into this module's code is used after this.
            unsafe { module.into_inner().free_memory() };
            same_results(program, &got?, expected, &how)?;
        }
    }
    for options in [DedupOptions::eager(), DedupOptions::batch()] {
        divided(program, expected, options)?;
    }
    Ok(())
}

/// A module with `options` on `store` in which `program` is defined and
/// finalized, and the address of each of its functions, in program order.
fn defined(
    program: &Program,
    options: DedupOptions,
    store: &Arc<dyn CodeStore>,
    how: &str,
) -> Result<(DedupModule<JITModule>, Vec<*const u8>), String> {
    let mut module = DedupModule::<JITModule>::with_options(jit_builder()?, options)
        .with_store(store.clone(), None);
    let ids = define_all(&mut module, program).map_err(|e| format!("{how}: {e}"))?;
    module
        .finalize_definitions()
        .map_err(|e| format!("{how}: finalizing: {e}"))?;
    let pointers = ids
        .iter()
        .map(|&id| module.try_get_finalized_function(id))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{how}: {e}"))?;
    Ok((module, pointers))
}

/// Check 2 of the module docs with `options`: two modules on one new store
/// define `program` at once, each on a scoped thread that keeps its module
/// (a `JITModule` stays on the thread that made it) until this thread has
/// made the calls of both, then frees it.
fn divided(
    program: &Program,
    expected: &[Option<i64>],
    options: DedupOptions,
) -> Result<(), String> {
    let store: Arc<dyn CodeStore> = Arc::new(SharedStore::new());
    std::thread::scope(|scope| {
        let (addresses_tx, addresses) = mpsc::channel();
        // Each module is freed once its sender here is dropped.
        let mut called = Vec::new();
        for runtime in 0..2 {
            let (called_tx, called_rx) = mpsc::channel::<()>();
            called.push(called_tx);
            let (addresses_tx, store) = (addresses_tx.clone(), store.clone());
            scope.spawn(move || {
                let how = format!("{options}, runtime {runtime} of 2 dividing a store");
                match defined(program, options, &store, &how) {
                    Ok((module, pointers)) => {
                        let addresses: Vec<usize> = pointers.iter().map(|&p| p as usize).collect();
                        let _ = addresses_tx.send(Ok((how, addresses)));
                        // Dropped before waiting, so that the other
                        // thread's panic (no answer) ends the answers.
                        drop(addresses_tx);
                        // Whether the calls were made or this thread's
                        // sender dropped (the other thread panicked).
                        let _ = called_rx.recv();
                        // SAFETY: the calls of its code are made (the
                        // children that made them have ended).
                        unsafe { module.into_inner().free_memory() };
                    }
                    Err(e) => {
                        let _ = addresses_tx.send(Err(e));
                    }
                }
            });
        }
        drop(addresses_tx);
        // A thread that panics sends nothing: fewer than two answers (its
        // panic is then the scope's).
        let answers: Vec<Result<(String, Vec<usize>), String>> = addresses.iter().take(2).collect();
        let mut checked = Ok(());
        for answer in answers {
            let compared = answer.and_then(|(how, addresses)| {
                let pointers: Vec<*const u8> = addresses.iter().map(|&a| a as *const u8).collect();
                let got = call_all(program, &pointers).map_err(|e| format!("{how}: {e}"))?;
                same_results(program, &got, expected, &how)
            });
            checked = checked.and(compared);
        }
        drop(called);
        checked
    })
}
