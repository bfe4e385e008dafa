//! What a [`DedupModule`](super::DedupModule) did, counted as it happens.

use crate::plan::Outcome;
use core::fmt;
use core::ops::AddAssign;
use std::time::Duration;

/// Counters of a [`DedupModule`](super::DedupModule).
///
/// Every successfully defined function is exactly one of: compiled, reused
/// (a copy of the code of a function with the same template, with its own
/// relocations), adapted (an adapter calling a function that differs only
/// in its calling convention), aliased (a duplicate whose id hands out the
/// canonical entry point), trampolined (a duplicate with an address of its
/// own), loaded from a code store, or defined from bytes; so after
/// `flush` or `finalize_definitions`, `defined == compiled + reused +
/// loaded + adapted + aliased + trampolined + bytes_defined`. With
/// [similar-function merging](crate::DedupOptions::similar), each merged
/// group's body is defined too (and counted like any function, usually in
/// `compiled`), without being one of `defined`: then `defined +
/// similar_groups` is that sum.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Functions defined through `define_function` (and `_with_control_plane`).
    pub defined: u64,
    /// Functions compiled: by the inner module, or, in a batch flush with
    /// more than one [thread](crate::DedupOptions::threads), on the flush's
    /// threads and then defined in the inner module from the code.
    pub compiled: u64,
    /// Functions defined as a copy of compiled code with relocations
    /// retargeted to their own callees and symbols.
    pub reused: u64,
    /// Functions defined from an entry of the code store
    /// ([`DedupModule::with_store`](super::DedupModule::with_store)).
    pub loaded: u64,
    /// Lookups in the code store that found no entry.
    pub store_misses: u64,
    /// Entries of the code store that could not be used (corrupt, another
    /// ISA, flags or version, another template, no valid MAC, not
    /// retargetable, or, in check mode, other code than the function's
    /// own); the function was compiled and its entry written again.
    pub store_rejected: u64,
    /// Lookups and writes the code store failed (down, slow, full): each
    /// was a miss or a write skipped, never an error. Writes are made on
    /// the store's writer thread, behind the flushes, and counted as those
    /// of `store_writes` are.
    pub store_errors: u64,
    /// Entries written to the code store. They are written on a thread of
    /// their own, behind the flushes, and counted when a flush ends (those
    /// written by then) and when the module waits for them
    /// ([`DedupModule::wait_for_store_writes`](super::DedupModule::wait_for_store_writes):
    /// all). On a store that reserves keys, every flush waits for them.
    pub store_writes: u64,
    /// Eager definitions left to the next flush, since another module
    /// sharing the store was compiling their template (see
    /// [`DedupModule::with_store`](super::DedupModule::with_store)).
    pub store_deferred: u64,
    /// Functions defined as an adapter to a compiled function that differs
    /// only in its calling convention (their bytes count in `code_bytes`).
    pub adapted: u64,
    /// Duplicates that share the canonical function's entry point.
    pub aliased: u64,
    /// Duplicates that keep a distinct address through a trampoline.
    pub trampolined: u64,
    /// Functions defined from raw bytes by the user (`define_function_bytes`).
    pub bytes_defined: u64,
    /// Machine-code bytes of the compiled and reused functions.
    pub code_bytes: u64,
    /// Bytes of trampolines emitted (every duplicate gets one, so that
    /// references to its id made before it was known to be a duplicate still
    /// resolve).
    pub trampoline_bytes: u64,
    /// Machine-code bytes that compiling every function would have emitted
    /// (each duplicate counted at its canonical function's size).
    pub code_bytes_without_dedup: u64,
    /// Time spent compiling, summed over the functions (on several threads,
    /// more than the time it took: see [`Stats::parallel_time`]).
    pub compile_time: Duration,
    /// Estimated compile time saved: for each duplicate and each reused
    /// function, the time the function whose code it shares took to compile.
    pub compile_time_saved: Duration,
    /// Heap bytes held by the code kept for reuse: one copy per template
    /// that has names (and, on an ISA without machine-code trampolines,
    /// where exact duplicates are copies, per template without).
    pub reuse_memory_bytes: u64,
    /// Rounds of call-graph refinement run by batch flushes, summed.
    pub refine_rounds: u64,
    /// Late merges (eager mode): classes given a second key because a
    /// callee turned out to be a duplicate, and compiled functions found
    /// equal to another (later calls to them go to the other).
    pub joined: u64,
    /// Functions compiled on each thread by the parallel phases of batch
    /// flushes (with more than one [thread](crate::DedupOptions::threads)),
    /// summed over the flushes: entry 0 is the thread that flushes, the
    /// others the threads started for it. Empty when no flush compiled in
    /// parallel. Every one of them is defined from its code (and counted
    /// in `compiled`), or failed, or was discarded
    /// ([`Stats::parallel_discarded`]).
    pub compiles_per_thread: Vec<u64>,
    /// Wall time of the parallel phases of batch flushes (compiling on
    /// every thread until the last one is done), summed.
    pub parallel_time: Duration,
    /// Functions compiled in a parallel phase whose code was not used:
    /// defining them in order found they had to be defined otherwise (a
    /// reference rewritten since, or another plan), and they were defined
    /// as a one-thread flush would. Counted so that a compile done twice
    /// shows; the selection leaves such functions out, so this stays 0
    /// unless late merges change a function under it.
    pub parallel_discarded: u64,
    /// Groups of similar functions merged by batch flushes (with
    /// [`DedupOptions::similar`](crate::DedupOptions::similar)): each is
    /// one body, defined under an anonymous id of the module's own and
    /// counted as a definition (usually in `compiled`, its bytes in
    /// `code_bytes`).
    pub similar_groups: u64,
    /// Functions turned into thunks that call their group's body (every
    /// member of a merged group; in eager mode, every member but the first
    /// of its shape); each thunk is a definition of its own (counted in
    /// `compiled`, its bytes in `code_bytes`, or, when equal to an earlier
    /// thunk, as that thunk's duplicate).
    pub similar_merged: u64,
    /// Functions defined without being compiled that were not run through
    /// the verifier because the verifier had accepted a function it reads
    /// exactly alike (equal stencils, source locations aside), so it would
    /// accept them too: one this module verified, or the one whose compile
    /// made the store entry it was loaded from, by the digest the entry
    /// holds (see `DedupModule`'s module docs on verifying).
    pub verified_by_equality: u64,
}

impl Stats {
    /// Counts what carrying out one plan did: the one place where
    /// definitions are counted by kind.
    pub fn count(&mut self, outcome: &Outcome) {
        match *outcome {
            Outcome::Duplicate {
                shares_address,
                trampoline_bytes,
                trampoline_time,
                of,
            } => {
                if shares_address {
                    self.aliased += 1;
                } else {
                    self.trampolined += 1;
                }
                self.trampoline_bytes += trampoline_bytes;
                self.compile_time += trampoline_time;
                if let Some(of) = of {
                    self.code_bytes_without_dedup += of.code_bytes;
                    self.compile_time_saved += of.compile_time;
                }
            }
            Outcome::Reused { code_bytes, saved } => {
                self.reused += 1;
                self.code_bytes += code_bytes;
                self.code_bytes_without_dedup += code_bytes;
                self.compile_time_saved += saved;
            }
            Outcome::Loaded { code_bytes, saved } => {
                self.loaded += 1;
                self.code_bytes += code_bytes;
                self.code_bytes_without_dedup += code_bytes;
                self.compile_time_saved += saved;
            }
            Outcome::Adapted {
                code_bytes,
                time,
                target,
            } => {
                self.adapted += 1;
                self.code_bytes += code_bytes;
                self.compile_time += time;
                if let Some(target) = target {
                    self.code_bytes_without_dedup += target.code_bytes;
                    self.compile_time_saved += target.compile_time.saturating_sub(time);
                }
            }
            Outcome::Compiled {
                code_bytes,
                time,
                kept_bytes,
            } => {
                self.compiled += 1;
                self.code_bytes += code_bytes;
                self.code_bytes_without_dedup += code_bytes;
                self.compile_time += time;
                self.reuse_memory_bytes += kept_bytes.unwrap_or(0);
            }
        }
    }
}

impl Stats {
    /// Counts one parallel phase of a batch flush: the functions each
    /// thread compiled (the flushing thread first) and its wall time.
    pub fn count_parallel_phase(&mut self, per_thread: &[u64], wall_time: Duration) {
        add_per_thread(&mut self.compiles_per_thread, per_thread);
        self.parallel_time += wall_time;
    }
}

impl Stats {
    /// Counts one merged group of similar functions with `members`
    /// members, whose body was defined.
    pub fn count_similar_group(&mut self, members: usize) {
        self.similar_groups += 1;
        self.similar_merged += members as u64;
    }
}

/// Adds `other` to `sum`, entry by entry (`sum` grows to `other`'s length).
fn add_per_thread(sum: &mut Vec<u64>, other: &[u64]) {
    if sum.len() < other.len() {
        sum.resize(other.len(), 0);
    }
    for (s, o) in sum.iter_mut().zip(other) {
        *s += o;
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "functions defined     {}", self.defined)?;
        writeln!(f, "compiled              {}", self.compiled)?;
        writeln!(f, "reused                {}", self.reused)?;
        if self.loaded + self.store_misses + self.store_rejected + self.store_errors > 0 {
            writeln!(
                f,
                "loaded from the store {} ({} misses, {} rejected, {} errors, {} written, \
                 {} deferred)",
                self.loaded,
                self.store_misses,
                self.store_rejected,
                self.store_errors,
                self.store_writes,
                self.store_deferred
            )?;
        }
        writeln!(f, "adapted               {}", self.adapted)?;
        writeln!(f, "aliased               {}", self.aliased)?;
        writeln!(f, "trampolined           {}", self.trampolined)?;
        writeln!(
            f,
            "code bytes            {} (+{} in trampolines; {} without dedup)",
            self.code_bytes, self.trampoline_bytes, self.code_bytes_without_dedup
        )?;
        write!(
            f,
            "compile time          {:.3} ms (about {:.3} ms saved)",
            self.compile_time.as_secs_f64() * 1e3,
            self.compile_time_saved.as_secs_f64() * 1e3
        )?;
        if !self.compiles_per_thread.is_empty() {
            write!(
                f,
                "\nparallel compiles     {:?} per thread in {:.3} ms ({} discarded)",
                self.compiles_per_thread,
                self.parallel_time.as_secs_f64() * 1e3,
                self.parallel_discarded
            )?;
        }
        if self.similar_groups > 0 {
            write!(
                f,
                "\nsimilar merged        {} functions into thunks of {} bodies",
                self.similar_merged, self.similar_groups
            )?;
        }
        if self.verified_by_equality > 0 {
            write!(
                f,
                "\nnot verified again   {} (exactly like a function the verifier accepted)",
                self.verified_by_equality
            )?;
        }
        Ok(())
    }
}

impl AddAssign for Stats {
    /// Sums the counters of two modules.
    fn add_assign(&mut self, other: Stats) {
        let Stats {
            defined,
            compiled,
            reused,
            loaded,
            store_misses,
            store_rejected,
            store_errors,
            store_writes,
            store_deferred,
            adapted,
            aliased,
            trampolined,
            bytes_defined,
            code_bytes,
            trampoline_bytes,
            code_bytes_without_dedup,
            compile_time,
            compile_time_saved,
            reuse_memory_bytes,
            refine_rounds,
            joined,
            compiles_per_thread,
            parallel_time,
            parallel_discarded,
            similar_groups,
            similar_merged,
            verified_by_equality,
        } = other;
        self.defined += defined;
        self.compiled += compiled;
        self.reused += reused;
        self.loaded += loaded;
        self.store_misses += store_misses;
        self.store_rejected += store_rejected;
        self.store_errors += store_errors;
        self.store_writes += store_writes;
        self.store_deferred += store_deferred;
        self.adapted += adapted;
        self.aliased += aliased;
        self.trampolined += trampolined;
        self.bytes_defined += bytes_defined;
        self.code_bytes += code_bytes;
        self.trampoline_bytes += trampoline_bytes;
        self.code_bytes_without_dedup += code_bytes_without_dedup;
        self.compile_time += compile_time;
        self.compile_time_saved += compile_time_saved;
        self.reuse_memory_bytes += reuse_memory_bytes;
        self.refine_rounds += refine_rounds;
        self.joined += joined;
        add_per_thread(&mut self.compiles_per_thread, &compiles_per_thread);
        self.parallel_time += parallel_time;
        self.parallel_discarded += parallel_discarded;
        self.similar_groups += similar_groups;
        self.similar_merged += similar_merged;
        self.verified_by_equality += verified_by_equality;
    }
}
