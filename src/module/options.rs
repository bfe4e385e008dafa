//! The options of a [`DedupModule`](super::DedupModule): when functions
//! are compiled, whether duplicates keep their own addresses, whether code
//! is reused, check mode, how many threads compile a batch, and whether
//! similar functions are merged.

#[cfg(doc)]
use super::{DedupModule, Stats};
use crate::similar::SimilarOptions;

/// When functions are compiled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// At `define_function`.
    #[default]
    Eager,
    /// At `finalize_definitions` (or [`DedupModule::flush`]).
    /// `define_function` takes the function out of the context (as
    /// compiling it there would rewrite it), leaving an empty function with
    /// its name and signature, and leaves `ctx.compiled_code()` `None`.
    Batch,
}

/// Options of a [`DedupModule`]. The default is eager, an address of its
/// own for every function id, reuse on, check mode off, one thread.
///
/// More options will come, so the struct cannot be written out in full
/// outside this crate: start from [`DedupOptions::eager`] (the default) or
/// [`DedupOptions::batch`] and change what differs with the `with_`
/// methods. Its [`Display`](core::fmt::Display) is the one name of a set of
/// options (`eager`, `batch, distinct, no reuse, check, 4 threads`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupOptions {
    /// When functions are compiled.
    pub mode: Mode,
    /// Give every function id its own address (a duplicate's is its
    /// trampoline, one direct jump), distinct from every other id's, as
    /// plain Cranelift does: safe for runtimes that compare function
    /// pointers or map code addresses back to functions. On by default.
    ///
    /// Off (the opt-in), a duplicate shares its canonical function's entry
    /// point, consistently: `get_finalized_function`, `get_address`,
    /// references in code and data defined afterwards, and object symbols
    /// all give the canonical function's address; except for a duplicate
    /// whose own address was already compiled into code or data when it
    /// was defined, which keeps its own address everywhere. Two ids may
    /// then compare equal as pointers (as with identical-code folding in a
    /// linker).
    pub distinct_addresses: bool,
    /// Reuse compiled code for functions that differ from a compiled one
    /// only in the callees and symbols they name. Keeps one copy of the
    /// code of each distinct template (see [`Stats::reuse_memory_bytes`]).
    pub reuse: bool,
    /// Check mode, for embedders who want the cache proved right on their
    /// own functions (like Cranelift's
    /// `enable_incremental_compilation_cache_checks`): every function
    /// defined without being compiled (duplicate, reused code, adapter) is
    /// also compiled on its own, and a difference from the code it is
    /// handed is an error naming both functions (see `check.rs`). Costs a
    /// compilation per such function (two per adapter), and keeps the code
    /// of each class. Off by default.
    pub check: bool,
    /// How many threads compile the functions of a batch flush (in
    /// [`Mode::Batch`]; eager mode compiles on the caller's thread). With
    /// 1, the default, everything happens on the caller's thread, one
    /// function after the other; 0 counts as 1. With more, a flush walks
    /// its functions, checks the code store entries it fetched and
    /// compiles what it compiles on that many threads (the caller's and
    /// `threads - 1` scoped threads started for each of these), then
    /// defines them in the inner module in the order one thread defines
    /// them, so that the module is the same, byte for byte, as with one
    /// thread; see [`DedupModule::flush`] for what differs (nothing in the
    /// code).
    pub threads: usize,
    /// Similar-function merging ([`crate::similar`]): functions that
    /// differ only in the values of a few integer or float constants, or
    /// in the functions they call or whose addresses they take, share one
    /// compiled body, which takes those values as parameters, and each of
    /// them becomes a thunk that passes its own values to it. `None` (the
    /// default): off. In [`Mode::Batch`], the functions of each flush are
    /// grouped and merged where the cost model predicts a saving; in
    /// [`Mode::Eager`], where nothing already compiled is compiled again,
    /// the first function of a shape keeps its own code, the second gets a
    /// body (if a body for two members pays) and a thunk, and every later
    /// one that fits the body a thunk only: the third and later members
    /// benefit. Not in [check mode](DedupOptions::check), which compares
    /// code with the functions' own and would find a thunk there.
    ///
    /// What it costs at run time: one extra call per entry into a merged
    /// function (its thunk calls the body; a tail call when both use
    /// `CallConv::Tail`, otherwise a call and a return), and in the body,
    /// a parameter in a register (or on the stack, past the argument
    /// registers) where the function had an immediate, so an operation
    /// such as `iadd x, 5` becomes a register-register one. Every id keeps
    /// its own address (its thunk's). What it saves: the members' code but
    /// one copy, and their compiles, at a cost the model of
    /// [`SimilarOptions::model`] predicts in bytes; groups it predicts not
    /// to pay are left alone. Functions with a stack limit (most of
    /// wasmtime's) are merged by default, every frame still checking the
    /// limit, but a merged call may trap for stack exhaustion a bounded
    /// number of bytes sooner ([`SimilarOptions::stack`],
    /// [`StackDepth`](crate::similar::StackDepth); `Exact` keeps such
    /// functions apart). See `similar.rs` in [`DedupModule`] and
    /// [`Stats::similar_groups`].
    pub similar: Option<SimilarOptions>,
    /// Whether another definition may replace an exported function's
    /// (`Linkage::Export`) when the code is linked, as in a shared library
    /// whose exported symbols the dynamic linker may bind elsewhere
    /// (`LD_PRELOAD`, an earlier library). Then an exported function is
    /// merged with nothing: it is compiled when defined, never a duplicate
    /// nor what a duplicate runs, and calls to it are never rewritten (14
    /// in the [module docs](crate::module)). `None` (the default): as the
    /// inner module says, yes for an object module or a module
    /// [`DedupModule::wrap`] does not know, no for a JIT module (which
    /// resolves its own names). `Some(false)` is for objects linked where
    /// nothing interposes (an executable, `-Bsymbolic`), to merge their
    /// exported functions too.
    pub interposable_exports: Option<bool>,
}

impl Default for DedupOptions {
    fn default() -> Self {
        Self::eager()
    }
}

impl core::fmt::Display for DedupOptions {
    /// The mode (`eager` or `batch`), then what differs from sharing
    /// addresses without reuse or checks: `, distinct`, `, no reuse`,
    /// `, check`, `, similar`, `, interposable exports` or `, exports not
    /// interposable` when set; then `, N threads` when more than one
    /// thread compiles batches.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let Self {
            mode,
            distinct_addresses,
            reuse,
            check,
            threads,
            similar,
            interposable_exports,
        } = *self;
        f.write_str(match mode {
            Mode::Eager => "eager",
            Mode::Batch => "batch",
        })?;
        for (on, what) in [
            (distinct_addresses, ", distinct"),
            (!reuse, ", no reuse"),
            (check, ", check"),
            (similar.is_some(), ", similar"),
            (interposable_exports == Some(true), ", interposable exports"),
            (
                interposable_exports == Some(false),
                ", exports not interposable",
            ),
        ] {
            if on {
                f.write_str(what)?;
            }
        }
        if threads.max(1) != 1 {
            write!(f, ", {threads} threads")?;
        }
        Ok(())
    }
}

impl DedupOptions {
    /// The default options: eager, distinct addresses, reuse on, check
    /// mode off, one thread, no similar-function merging.
    pub const fn eager() -> Self {
        Self {
            mode: Mode::Eager,
            distinct_addresses: true,
            reuse: true,
            check: false,
            threads: 1,
            similar: None,
            interposable_exports: None,
        }
    }

    /// The default options in batch mode.
    pub const fn batch() -> Self {
        Self::eager().with_mode(Mode::Batch)
    }

    /// These options in `mode`.
    pub const fn with_mode(self, mode: Mode) -> Self {
        Self { mode, ..self }
    }

    /// These options with [`DedupOptions::distinct_addresses`] set.
    pub const fn with_distinct_addresses(self, distinct_addresses: bool) -> Self {
        Self {
            distinct_addresses,
            ..self
        }
    }

    /// These options with [`DedupOptions::interposable_exports`] set.
    pub const fn with_interposable_exports(self, interposable: bool) -> Self {
        Self {
            interposable_exports: Some(interposable),
            ..self
        }
    }

    /// These options with [`DedupOptions::reuse`] set.
    pub const fn with_reuse(self, reuse: bool) -> Self {
        Self { reuse, ..self }
    }

    /// These options with [`DedupOptions::check`] set.
    pub const fn with_check(self, check: bool) -> Self {
        Self { check, ..self }
    }

    /// These options with [`DedupOptions::threads`] set: batch flushes
    /// compile on `threads` threads (0 counts as 1).
    pub const fn with_threads(self, threads: usize) -> Self {
        Self { threads, ..self }
    }

    /// These options with [`DedupOptions::similar`] on: batch flushes
    /// merge similar functions with `similar`'s limits and cost model.
    /// (Set the field to `None` to turn it off again.)
    pub const fn with_similar(self, similar: SimilarOptions) -> Self {
        Self {
            similar: Some(similar),
            ..self
        }
    }

    /// Every combination of mode and address identity with reuse on, and
    /// each mode with reuse off: for tests and comparisons that must cover
    /// every option. [Check mode](DedupOptions::check) is on in the four
    /// with reuse on, so that whatever iterates these has every duplicate,
    /// reused code and adapter compiled again and compared, and off in the
    /// two with reuse off, so that the path without checks runs too; those
    /// two also merge similar functions ([`DedupOptions::similar`], which
    /// check mode would skip), keeping functions with a stack limit apart
    /// ([`StackDepth::Exact`](crate::similar::StackDepth::Exact)): so
    /// that a differential check against plain Cranelift may compare
    /// everything, whether a stack limit traps included (a program can
    /// compute any limit: one between the depths a merged and an
    /// unmerged call reach, or one near the top of the address space,
    /// where Cranelift's check wraps).
    pub const ALL: [DedupOptions; 6] = [
        DedupOptions {
            mode: Mode::Eager,
            distinct_addresses: false,
            reuse: true,
            check: true,
            threads: 1,
            similar: None,
            interposable_exports: None,
        },
        DedupOptions {
            mode: Mode::Eager,
            distinct_addresses: true,
            reuse: true,
            check: true,
            threads: 1,
            similar: None,
            interposable_exports: None,
        },
        DedupOptions {
            mode: Mode::Batch,
            distinct_addresses: false,
            reuse: true,
            check: true,
            threads: 1,
            similar: None,
            interposable_exports: None,
        },
        DedupOptions {
            mode: Mode::Batch,
            distinct_addresses: true,
            reuse: true,
            check: true,
            threads: 1,
            similar: None,
            interposable_exports: None,
        },
        DedupOptions {
            mode: Mode::Eager,
            distinct_addresses: false,
            reuse: false,
            check: false,
            threads: 1,
            similar: Some(SimilarOptions::DEFAULT.with_exact_stack_depth()),
            interposable_exports: None,
        },
        DedupOptions {
            mode: Mode::Batch,
            distinct_addresses: true,
            reuse: false,
            check: false,
            threads: 1,
            similar: Some(SimilarOptions::DEFAULT.with_exact_stack_depth()),
            interposable_exports: None,
        },
    ];
}
