//! [`DedupModule`]: a `cranelift_module::Module` that compiles each distinct
//! function once.
//!
//! Wrap the module you use today (`JITModule`, `ObjectModule`, ...) and keep
//! your code generator as it is: every `Module` method forwards to the inner
//! module, except `define_function*`, which first looks the function up by
//! its [fingerprint](crate::fingerprint).
//!
//! # What this module guarantees
//!
//! 1. A function whose fingerprint was compiled before is not compiled again.
//!    Its id is defined in the inner module as a trampoline into the
//!    canonical function (see [`trampoline`]), so every reference to the id
//!    resolves to working code, including references compiled before the id
//!    was known to be a duplicate.
//! 2. A function whose [template](crate::Fingerprint::to_template) was compiled
//!    before (same code, other callees or symbols) is not compiled again
//!    when [`DedupOptions::reuse`] is on (the default): it is defined from
//!    a copy of that code with its relocations retargeted to its own names
//!    (see [`reuse`]). It has its own entry point and calls its own callees.
//! 3. A function that differs from a compiled one only in its calling
//!    convention (and uses nothing an extra frame would change) is defined
//!    as an [`adapter`] that calls the compiled one: its body is not
//!    compiled again.
//! 4. Before a function is fingerprinted and compiled, its references to
//!    known duplicates are rewritten to their canonical functions (so callers
//!    of twins become twins, and calls skip the trampoline).
//! 5. In batch mode, the functions of a flush are first refined over their
//!    call graph ([`crate::refine`]): callees are compared by class, so
//!    self-recursive and mutually recursive twins (any cycle length) become
//!    duplicates of one another, and functions that differ anywhere in a
//!    cycle do not. Callees of one class count as one callee: a function
//!    that calls `g0` and then its twin `g1` is a duplicate of one that
//!    calls `g0` twice, and so is one that calls itself and a twin of
//!    itself.
//! 6. One address per function id, whichever way it is obtained:
//!    `get_finalized_function`, `get_address`, `func_addr` and
//!    `symbol_value` in code, function relocations in data objects (and in
//!    the object file, the id's symbol) all give the same address. With
//!    [`DedupOptions::distinct_addresses`] (the default) that is an address
//!    of the id's own (a duplicate's trampoline), distinct from every other
//!    id's, as in plain Cranelift: runtimes that compare function pointers
//!    see no difference (like lld's `--icf=safe`, which keeps
//!    address-significant functions apart). Without it (the opt-in), a
//!    duplicate *shares* its canonical function's entry point everywhere,
//!    unless its own address was already compiled into code or data when
//!    it was defined (as `func_addr`, a symbol global value, a data
//!    relocation, or a relocation of raw bytes): then it keeps its own
//!    address everywhere, so nothing handed out changes. References made
//!    after a sharing duplicate is defined are rewritten to the canonical
//!    function. In both, a name a function uses as data is compared by
//!    value when refining, never by class: a function that returns or
//!    compares its own address does not merge with a twin that does the
//!    same with its own, since the shared code could only produce one of
//!    the two addresses.
//! 7. A function that fails to verify or compile returns the error and leaves
//!    no cache entry and no definition: a later correct function with the same
//!    fingerprint compiles, and the id may be defined again. A function that
//!    is defined without being compiled (duplicate, reused code, adapter) is
//!    verified first when the flags enable the verifier (unless the
//!    verifier accepted one exactly like it: it reads them alike; a
//!    store entry says so of the function it was compiled from), and
//!    fingerprinting never panics (see `verify.rs`); in batch mode a
//!    failure stops nothing
//!    else and is reported until dealt with (see `batch.rs`).
//! 8. What the wrapped module accepts, the wrapper accepts, with the same
//!    effect, and what it refuses, the wrapper refuses with the same kind of
//!    error; where the wrapped module panics on misuse, the wrapper gives an
//!    error instead. The few differences, and why each is needed, are in
//!    [the table below](#what-differs-from-the-wrapped-module). A function
//!    may be defined with a signature other than the one it was declared
//!    with (as RustPython's JIT does, learning the return type while it
//!    translates): everything jitfold builds for it (trampolines, adapters,
//!    thunks, stored entries) uses the signature it was defined with, and
//!    two functions merge only if their defined signatures allow it.
//! 9. With [`DedupOptions::check`], every duplicate, reused code and adapter
//!    is also compiled on its own and compared with the code it is handed;
//!    a difference is an error naming both functions (see `check.rs`).
//! 10. What happens to each function is logged through the `log` crate
//!     (target `jitfold::module`), as Cranelift logs: at debug level each
//!     function's outcome with both names where there are two (compiled,
//!     duplicate of, with whether it shares the address, reused the code
//!     of, adapter for, failed), and late merges; at trace level reference
//!     rewrites, batch recording and refinement.
//! 11. With a code store ([`DedupModule::with_store`]), a function that
//!     would be compiled is first looked up by its template, and what is
//!     compiled is stored: an entry is used only if it passes every check
//!     (see `stored.rs` and [`crate::store`]), and a store that fails is a
//!     miss, never an error. With a [`crate::store::SharedStore`], modules
//!     on different threads compile each template once in total.
//! 12. In batch mode with [`DedupOptions::threads`] above one, what a flush
//!     compiles is compiled on that many threads and defined in definition
//!     order: the module is the one a single thread makes (see
//!     `parallel.rs`).
//! 13. With [`DedupOptions::similar`] (off by default), functions that
//!     would be compiled and differ only in a few constants, callees or
//!     addresses share one compiled body, and each becomes a thunk passing
//!     its values (in batch mode, the groups of a flush; in eager mode,
//!     from the second function of a shape on, nothing compiled twice);
//!     every id keeps an address of its own, and no cache entry describes
//!     code other than its own (see `similar.rs`).
//! 14. A function whose symbol a definition elsewhere may replace when
//!     the code is linked is compiled when it is defined, in either mode,
//!     outside the cache: it is never a duplicate, no duplicate runs its
//!     code, and calls to it are never rewritten. That is a function
//!     declared [`Linkage::Preemptible`](cranelift_module::Linkage) (a weak
//!     symbol) in any module but a `JITModule`, and, in an object module (or any module but a `JITModule`
//!     given to [`DedupModule::wrap`]; see
//!     [`DedupOptions::interposable_exports`]), one declared
//!     `Linkage::Export`:
//!     cranelift-object gives it dynamic scope, so in a shared library
//!     calls to it go through the PLT and bind to whichever definition the
//!     dynamic linker finds first (`LD_PRELOAD`, an earlier library). A
//!     twin that jumped to it, or a caller rewritten to call it, would
//!     then run the other definition. (A JIT module resolves its own
//!     symbols, and always uses the code defined for an id: there,
//!     exported and preemptible functions are merged like any other.) A
//!     function defined (or recorded) before a declaration gives it such a
//!     linkage may be merged already: that declaration is
//!     [`DedupError::PreemptibleAfterDefinition`].
//!
//! # What differs from the wrapped module
//!
//! Every check the wrapper makes that `JITModule` or `ObjectModule`
//! (cranelift 0.135.8) does not make, and every call whose outcome
//! differs. `tests/suite/api_differential.rs` (and the fuzz target
//! `module_api`) runs random sequences of `Module` calls against the plain
//! module and the wrapper, in every option set of [`DedupOptions::ALL`],
//! and fails on any difference but these.
//!
//! | call | `JITModule` / `ObjectModule` | `DedupModule` | why |
//! |---|---|---|---|
//! | `define_function*` or `define_data` of an id never declared | panics (index out of bounds; `ObjectModule` after compiling) | `ModuleError::Undeclared` | an error instead of a panic |
//! | `define_function` that panics inside Cranelift (a bug: `ObjectModule` 0.135.8 panics defining a function first declared as an import, then as exported) | panics | [`DedupError::CraneliftPanic`] | an error instead of a panic |
//! | `define_function` of an import, or of an id defined before | `InvalidImportDefinition` / `DuplicateDefinition` (`ObjectModule` compiles first) | the same error, before anything is compiled | none: the same kind |
//! | `define_function` with a signature other than the declared one | accepted: compiled with the signature it is defined with | the same | none (before: `IncompatibleSignature`, see 8) |
//! | `declare_function` of a defined (or recorded) function again as preemptible, or as exported where exports may be interposed | `ObjectModule` accepts (the symbol becomes weak or dynamic); `JITModule` accepts | `ObjectModule`: [`DedupError::PreemptibleAfterDefinition`]; `JITModule`: accepted | in an object file the function may already be merged, and a definition elsewhere could then replace the code its twins run (see 14); a JIT uses the code defined for an id, so nothing can replace it |
//! | `declare_function` of such a function with a signature other than its declaration's | `IncompatibleSignature`, after making the function weak or exported all the same (`FunctionDeclaration::merge` in cranelift-module changes the linkage before it compares the signatures) | `IncompatibleSignature`, the linkage left as it was | a function made weak after it was merged could be replaced when linked, and its twins would run the other code |
//! | `finalize_definitions` (`finish`) while a defined function or data object refers to a local one that is not defined | `JITModule` looks its name up among the host's symbols and panics when none is found; `ObjectModule::finish` asserts every local id is defined (in debug builds; else it writes an undefined symbol) | [`DedupError::ReferencedButNotDefined`] from `finalize_definitions` and `try_finish` (`finish` panics with it), naming each | an error instead of a panic; a local id bound to a host symbol of the same name is a mistake the wrapper does not repeat |
//! | `get_finalized_function`, `get_finalized_data`, `get_address` of an id not defined or not finalized | panics | panics too (the `try_` methods return the error) | none |
//! | batch mode: a definition that fails to verify or compile | `define_function` returns the error | `define_function` records it and returns `Ok`; the error comes from the next `finalize_definitions` (or [`DedupModule::flush`]), and every later one until the id is defined again or given up ([`DedupModule::take_failed_definitions`]) | batch mode compiles at the flush, by design; a failure that only one call reported could be missed |
//! | `ctx.compiled_code()` after `define_function` | the function's code | `None` where nothing was compiled (a duplicate, reused or loaded code; every definition in batch mode) | what was not compiled has no compiled code (see below) |
//!
//! # Where the wrapper sits
//!
//! On a cache hit, and when code is reused or loaded, nothing is compiled,
//! so after `define_function` the context holds no compiled code:
//! `ctx.compiled_code()` is `None`, as it is after every definition in
//! batch mode. (What an earlier compile left there is dropped first, so it
//! is never another function's code; Cranelift keeps that field private to
//! its crate, so it cannot be filled in from the canonical function.)
//! After a definition that did compile, it is that compile's code, as
//! with the inner module alone. Wrappers that read
//! the compiled code after each definition (unwind info, disassembly) must
//! therefore be the *inner* module of a `DedupModule`, not wrap it; they then
//! see every function that is actually compiled, and only those (except,
//! in batch mode on several [threads](DedupOptions::threads), the functions
//! compiled on the flush's threads, which they receive as bytes). Inner
//! modules receive duplicates' trampolines and reused code through
//! `define_function_bytes`, for which `cranelift-object` writes no unwind
//! information; `DedupModule<ObjectModule>` writes their frame
//! descriptions itself when the object has unwind information (see
//! `unwind.rs`), so every function's address is covered by an FDE.
//!
//! # Modes
//!
//! [`Mode::Eager`] compiles at `define_function` (lowest latency).
//! [`Mode::Batch`] only records definitions and compiles at
//! `finalize_definitions` (or [`DedupModule::flush`]), after refining and
//! grouping all of them, so that callers defined before their callees
//! still benefit from 4, and recursive twins merge (5). Eager mode cannot
//! prove recursive twins equal before the second one is compiled; what it
//! can do without recompiling is rewriting calls to known duplicates (4)
//! and copying code between twins with one template (2). The entry point
//! of a compiled id never changes afterwards.
//!
//! In batch mode, [`DedupOptions::threads`] above 1 walks a flush's
//! functions, checks the store entries it fetched and compiles the
//! functions it compiles on that many threads, then defines them in the
//! order a flush on one thread does: the module is the same, byte for
//! byte, as with one thread (see `parallel.rs` for what else differs:
//! where object files keep their frame descriptions, and the statistics
//! of time).
//!
//! # Lifecycle of an id, and of a flush
//!
//! An id is in one `State` at a time (`ids.rs`); it is defined in the
//! inner module exactly when it is compiled, a duplicate or bytes:
//!
//! | from | to | when |
//! |---|---|---|
//! | undefined | compiled, duplicate, bytes | eager mode: `define_function` succeeds (compiled, reused, loaded or an adapter: compiled; a trampoline or alias: duplicate; `define_function_bytes`, or a merged body's trap: bytes) |
//! | undefined | pending | batch mode: `define_function` records it; eager mode on a store that reserves keys: its template is being compiled elsewhere (8 in `stored.rs`) |
//! | pending | planned | a flush plans it as a duplicate |
//! | planned | pending | a flush undoes its plan (a root or a duplicate failed) |
//! | pending, planned | undefined, then defined or failed | a flush defines it |
//! | undefined (failed) | as from undefined | defined again by the user |
//!
//! A defined id never changes state again (`DuplicateDefinition`). A
//! recorded function is also a `Record` of the next flush (`flush.rs`),
//! whose `Role` says what it is to that flush: open (planned by every
//! planning), as written (a root put back as the user wrote it) or alone
//! (planned as nothing); roles only move from open towards alone.
//!
//! A flush (`batch.rs`, `define_pending`) runs these phases:
//!
//! 1. plan: walk the functions (on the flush's threads, `parallel.rs`),
//!    refine over the call graph, then plan exact duplicates
//!    round by round, rewriting references to them (each round one pure
//!    decision, `duplicates.rs`, applied once what it counts on is
//!    verified); put the roots back as the user wrote them, and plan again
//!    while that would change an address (`roots.rs`);
//! 2. take the store's entries for what needs code, fetched ahead while
//!    the flush recorded and planned, fetch those not asked for yet, and
//!    check them on the flush's threads (`stored.rs`);
//! 3. merge similar functions among those that need code into bodies and
//!    thunks (`similar.rs`);
//! 4. compile what gets code of its own on the flush's threads
//!    (`parallel.rs`);
//!
//!    (what needs code, and what gets code of its own, is the flush's
//!    forecast, one pure step: 7 in [`crate::plan`], asked again by each
//!    of these phases of the functions as they then are);
//! 5. define the roots, then the planned duplicates; a failure of either
//!    undoes the plan for what is not defined yet and plans again. Each
//!    failure leaves one more function failed for good in this flush, so
//!    this ends after at most as many failures as functions (a bound the
//!    loop states);
//! 6. define the rest, each as its own plan says (`define.rs`), those
//!    whose template another module is compiling last;
//! 7. list the failures in definition order; debug builds then check
//!    what holds after every flush (8 in `batch.rs`).

//! # Layout
//!
//! Deciding is [the planner's](crate::plan) (pure, over the module-free
//! cache of compiled results); doing is this module's, one concern a file,
//! each file owning its data:
//!
//! | file | what it does | what it owns |
//! |---|---|---|
//! | `forward.rs` | the `Module` implementation | |
//! | `ids.rs` | each id's state, misuse checks, references, finalization | `Ids` |
//! | `define.rs` | carries out a plan for one function, counts its outcome | |
//! | `verify.rs` | the walk that never panics, verification before trust (once for functions exactly alike; not for one read alike to the function a store entry was compiled from) | `Verified`, `read_digests`, `read_digest_matches` |
//! | `flush.rs` | a flush's record of each function: its role, walk, original and code | `Record` |
//! | `duplicates.rs` | batch mode: one round of planning decided as a value (which function is a duplicate of which, and what that counts on), pure | |
//! | `batch.rs` | batch mode: refine, plan duplicates round by round (verifying what each round counts on), define, report failures | `Batch` |
//! | `roots.rs` | batch mode: what planned duplicates run is defined first; undoing the plan when it fails | |
//! | `aliases.rs` | checks of the value aliases compiling would resolve, before a function is defined without compiling | |
//! | `parallel.rs` | batch mode on several threads: walking a flush's functions before it plans, compiling what it will compile before it defines | |
//! | `pool.rs` | a flush's threads, each taking the next job | |
//! | `join.rs` | eager mode's late merges of callers of twins | `Joins` |
//! | `retired.rs` | classes whose code a JIT bound to a host symbol the module may still define | `Retired` |
//! | `address.rs` | one address per id, rewriting references to duplicates | |
//! | `check.rs` | check mode's comparison with separately compiled code | `ReferenceCode` |
//! | `similar.rs` | merging similar functions into a body and thunks (both modes) | `EagerShapes` |
//! | `stored.rs` | a code store consulted before compiling (through [`crate::store::load`]; in batch mode on several threads, the entries a flush fetched checked on its threads), written after | `Stored`, `CheckedEntry` |
//! | [`reuse`], [`adapter`], [`trampoline`] | the code a step defines | |
//! | `jit.rs`, `object.rs` | the inherent methods of `JITModule` and `ObjectModule` (features `jit`, `object`) | |
//! | `code_map.rs` | which ids run the code at an address | `CodeMap` |
//! | `frames.rs`, `unwind.rs` | frames of code defined from bytes, written as FDEs in object files | `Frames` |
//! | `options.rs`, [`stats`], `error.rs` | options, statistics, errors | |

pub mod adapter;
mod address;
mod aliases;
mod batch;
mod check;
#[cfg(feature = "jit")]
mod code_map;
mod define;
mod duplicates;
mod error;
mod flush;
mod forward;
mod frames;
mod ids;
#[cfg(feature = "jit")]
mod jit;
mod join;
#[cfg(feature = "object")]
mod object;
mod options;
mod parallel;
mod pool;
mod retired;
pub mod reuse;
mod roots;
mod similar;
pub mod stats;
mod stored;
pub mod trampoline;
#[cfg(feature = "object")]
mod unwind;
mod verify;

use crate::cache::{ClassId, DedupCache};
use crate::fingerprint::Fingerprinter;
use crate::plan::{ClassFacts, CompiledCache, Policy};
use cranelift_codegen::entity::SecondaryMap;
use cranelift_module::{FuncId, Module};
use ids::{Ids, State};
use reuse::CodeTemplate;

#[doc(hidden)]
pub use check::Poison;
pub use error::DedupError;
// For `report`, which plans as a JIT would.
#[cfg(all(feature = "jit", feature = "tools"))]
pub(crate) use jit::records_exception_tables as jit_records_exception_tables;
pub use options::{DedupOptions, Mode};
pub use stats::Stats;

/// A `Module` that compiles each distinct function once; see the
/// [module docs](self).
///
/// Each part of its state is owned by the file that keeps it: the ids
/// (`ids.rs`), batch definitions (`batch.rs`), late merges (`join.rs`),
/// reference code for check mode (`check.rs`), code ranges of the JIT
/// (`jit.rs`) and frames of code defined from bytes (`unwind.rs`); what was
/// compiled, as any module could use it, is the [planner's
/// cache](crate::plan::CompiledCache). `define.rs` carries out plans and
/// `forward.rs` is the `Module` implementation.
pub struct DedupModule<M: Module> {
    inner: M,
    options: DedupOptions,
    /// What was compiled, as any module could use it (see [`crate::plan`]).
    compiled: CompiledCache<CodeTemplate>,
    /// The function that started each class in this module.
    class_canonical: SecondaryMap<ClassId, Option<FuncId>>,
    fingerprinter: Fingerprinter,
    /// Whether the ISA has a machine-code trampoline (see [`trampoline`]),
    /// which every duplicate then gets.
    machine_trampolines: bool,
    ids: Ids,
    /// Late merges of eager mode (see `join.rs`).
    joins: join::Joins,
    /// Definitions recorded in batch mode (see `batch.rs`).
    batch: batch::Batch,
    /// The reference code of each class, in check mode (see `check.rs`).
    reference: check::ReferenceCode,
    /// Where each finalized function's code is (see `jit.rs`).
    #[cfg(feature = "jit")]
    code_map: code_map::CodeMap,
    /// Functions defined from bytes by jitfold (reused code, trampolines)
    /// with how their frames are described (see `unwind.rs`).
    frames: frames::Frames,
    /// Functions whose own address was compiled into code or data (see 6
    /// in the module docs): as duplicates they keep it.
    address_taken: SecondaryMap<FuncId, bool>,
    /// The code store, if any (see `stored.rs`).
    stored: Option<stored::Stored>,
    /// Functions the verifier accepted (see `verify.rs`).
    verified: verify::Verified,
    /// Shapes seen by eager mode's similar-function merging (see
    /// `similar.rs`).
    eager_shapes: similar::EagerShapes,
    /// What each class's code names, and the classes no later function
    /// may run (see `retired.rs`).
    retired: retired::Retired,
    /// Whether the inner module may write frame descriptions of code
    /// defined from bytes (see `stored.rs`).
    writes_frames: bool,
    /// Whether the inner module records the exception tables of what it
    /// compiles, which code defined from bytes then lacks
    /// ([`Policy::compile_catching`]): unless it is known not to.
    records_exception_tables: bool,
    /// Whether the inner module compiles a function exactly as given, with
    /// `Context::compile` for its own ISA, which runs Cranelift's checks as
    /// the flags say (so that a store entry may record them, see 6 in
    /// `verify.rs`): known of `JITModule` and `ObjectModule` only.
    inner_compile_checks: bool,
    /// Whether an exported function's symbol may be interposed, replaced
    /// by another definition when its object is linked into a shared
    /// library (see 14 in the module docs): unless it is known not to.
    exports_interposable: bool,
    /// Whether a preemptible (weak) function's symbol may be replaced by
    /// another definition when its code is linked (see 14 in the module
    /// docs): unless the inner module is a `JITModule`, which always uses
    /// the code defined for an id.
    preemptible_replaceable: bool,
    stats: Stats,
}

/// What `DedupModule::wrap` knows of its inner module `M` by its type, and
/// what follows for code defined from bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum InnerKind {
    /// cranelift-jit's `JITModule`: it writes no frame descriptions, and
    /// records exception tables only with its `wasmtime-unwinder` feature;
    /// it resolves its own symbols (no export or weak symbol is replaced).
    Jit,
    /// cranelift-object's `ObjectModule`: it writes no exception tables.
    #[cfg_attr(not(feature = "object"), allow(dead_code))]
    Object,
    /// Any other: assumed to need all of it, and to compile in its own
    /// way (another function, another ISA, a cache that skips the
    /// verifier).
    Other,
}

#[cfg_attr(
    not(any(feature = "jit", feature = "object")),
    allow(clippy::extra_unused_type_parameters)
)]
fn inner_kind<M: Module>() -> InnerKind {
    #[cfg(feature = "jit")]
    if typeid::of::<M>() == typeid::of::<cranelift_jit::JITModule>() {
        return InnerKind::Jit;
    }
    #[cfg(feature = "object")]
    if typeid::of::<M>() == typeid::of::<cranelift_object::ObjectModule>() {
        return InnerKind::Object;
    }
    InnerKind::Other
}

impl InnerKind {
    /// Whether the module compiles a function as given, with
    /// `Context::compile` for its own ISA (`define_function_with_control_plane`
    /// in cranelift-jit and cranelift-object 0.135.8), which verifies it
    /// and runs the passes `verify.rs` checks as the flags say.
    fn compile_checks(self) -> bool {
        self != InnerKind::Other
    }

    /// Whether the module may write frame descriptions of code defined
    /// from bytes, so that store entries without unwind information are
    /// not used.
    fn writes_frames(self) -> bool {
        self != InnerKind::Jit
    }

    /// [`Policy::compile_catching`].
    fn records_exception_tables(self) -> bool {
        match self {
            #[cfg(feature = "jit")]
            InnerKind::Jit => jit::records_exception_tables(),
            #[cfg(not(feature = "jit"))]
            InnerKind::Jit => true,
            InnerKind::Object => false,
            InnerKind::Other => true,
        }
    }
}

/// The builder of a module `DedupModule` can make itself:
/// [`DedupModule::with_options`] takes one (`JITBuilder`, feature `jit`;
/// `ObjectBuilder`, feature `object`).
pub trait InnerBuilder {
    /// The module it builds.
    type Module: Module;
    /// Builds it, as the module's own `new` does.
    fn build(self) -> Self::Module;
}

impl<M: Module> DedupModule<M> {
    /// A new module made from `builder` (a `JITBuilder` or an
    /// `ObjectBuilder`, as `JITModule::new` or `ObjectModule::new` make
    /// theirs), with `options`: `DedupModule::wrap(builder's module,
    /// options)`, which knows what that module needs (see
    /// [`DedupModule::wrap`]).
    pub fn with_options<B: InnerBuilder<Module = M>>(builder: B, options: DedupOptions) -> Self {
        Self::wrap(builder.build(), options)
    }

    /// Wraps `inner`. Declarations already made in `inner` are kept;
    /// definitions are not known to the wrapper (a function already defined
    /// in `inner` counts as undefined, so referencing it makes
    /// `finalize_definitions` fail): define through the wrapper.
    /// (`DedupModule::<JITModule>::new` and `DedupModule::<ObjectModule>::new`
    /// make the inner module from its builder, as `JITModule::new` and
    /// `ObjectModule::new` do, with the default options; `with_options`
    /// with others.)
    ///
    /// What the inner module needs of code defined from bytes is decided
    /// by its type, whichever constructor made the wrapper: a `JITModule`
    /// writes no frame descriptions (so [store](DedupModule::with_store)
    /// entries without unwind information serve it), records exception
    /// tables only with cranelift-jit's `wasmtime-unwinder` feature, and
    /// resolves its own symbols; an `ObjectModule` writes no exception
    /// tables. Of any other module, it assumes what is safe for any: that
    /// it writes frame descriptions and records exception tables only for
    /// the functions it compiles, so that code defined from bytes has
    /// neither (see
    /// [`Policy::compile_catching`](crate::plan::Policy::compile_catching)),
    /// and, unless the options say otherwise
    /// ([`DedupOptions::interposable_exports`]), that an exported
    /// function's symbol may be interposed as an object file's may (see 14
    /// in the module docs).
    ///
    /// Of every inner module it assumes that `define_function` compiles
    /// the function it is given, naming what that function names: the
    /// code it leaves in the context is kept for functions of the same
    /// template ([reuse](DedupOptions::reuse) and the
    /// [store](DedupModule::with_store)), each relocation bound to the
    /// name in the same place of the other function. A module that
    /// rewrites the functions it compiles (that redirects calls, say)
    /// must be wrapped with reuse off and no store.
    pub fn wrap(inner: M, options: DedupOptions) -> Self {
        let declared_functions = inner.declarations().get_functions().count();
        let declared_data = inner.declarations().get_data_objects().count();
        let machine_trampolines =
            trampoline::trampoline_to(inner.isa(), FuncId::from_u32(0)).is_some();
        let kind = inner_kind::<M>();
        Self {
            inner,
            options,
            compiled: CompiledCache::new(),
            class_canonical: SecondaryMap::new(),
            fingerprinter: Fingerprinter::new(),
            machine_trampolines,
            ids: Ids::new(declared_functions, declared_data),
            joins: join::Joins::default(),
            batch: batch::Batch::default(),
            reference: check::ReferenceCode::default(),
            #[cfg(feature = "jit")]
            code_map: code_map::CodeMap::default(),
            frames: frames::Frames::default(),
            address_taken: SecondaryMap::new(),
            stored: None,
            verified: verify::Verified::default(),
            eager_shapes: similar::EagerShapes::default(),
            retired: retired::Retired::default(),
            writes_frames: kind.writes_frames(),
            records_exception_tables: kind.records_exception_tables(),
            inner_compile_checks: kind.compile_checks(),
            exports_interposable: options
                .interposable_exports
                .unwrap_or(kind != InnerKind::Jit),
            preemptible_replaceable: kind != InnerKind::Jit,
            stats: Stats::default(),
        }
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The wrapped module, mutably. Definitions made on it directly bypass
    /// deduplication and are not known to the wrapper, and declarations
    /// made on it bypass the wrapper's checks (a function declared there
    /// anew is not known either, and one redeclared so that it becomes
    /// preemptible or an interposable export is not refused: see 14 in
    /// the module docs).
    pub fn inner_mut(&mut self) -> &mut M {
        &mut self.inner
    }

    /// Unwraps the inner module (pending batch definitions are dropped; call
    /// [`DedupModule::flush`] first).
    pub fn into_inner(self) -> M {
        self.inner
    }

    /// The options this module was made with.
    pub fn options(&self) -> DedupOptions {
        self.options
    }

    /// What the module did so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The cache of fingerprints of compiled functions. (Its hit count
    /// stays 0: looking up does not write; duplicates are counted in
    /// [`Stats`].)
    pub fn cache(&self) -> &DedupCache {
        self.compiled.exact()
    }

    /// The function whose code `id` runs: `id` itself unless it is a
    /// duplicate. `None` if `id` is not defined (or still pending).
    pub fn canonical(&self, id: FuncId) -> Option<FuncId> {
        match self.ids.state(id) {
            State::Compiled(_) | State::Bytes => Some(id),
            State::Duplicate { canonical } => Some(canonical),
            State::Undefined | State::Pending | State::Planned { .. } => None,
        }
    }

    /// The name `id` was declared with.
    fn function_name(&self, id: FuncId) -> String {
        self.inner
            .declarations()
            .get_function_decl(id)
            .linkage_name(id)
            .into_owned()
    }

    /// What the planner may do in this module.
    fn policy(&self) -> Policy {
        Policy {
            reuse: self.options.reuse,
            machine_trampolines: self.machine_trampolines,
            store: self.stored.is_some(),
            compile_catching: self.records_exception_tables,
            similar: self.options.similar.is_some()
                && self.options.mode == Mode::Eager
                && !self.options.check
                && !self.eager_shapes.busy,
        }
    }

    /// The function that started `class` in this module.
    fn canonical_of(&self, class: ClassId) -> FuncId {
        self.class_canonical[class].expect("every class has its first function")
    }

    /// The facts of the class `id` was compiled (or reused) as, if any.
    fn facts_of(&self, id: FuncId) -> Option<ClassFacts> {
        match self.ids.state(id) {
            State::Compiled(class) => Some(self.compiled.facts(class)),
            State::Undefined
            | State::Pending
            | State::Planned { .. }
            | State::Duplicate { .. }
            | State::Bytes => None,
        }
    }

    /// Checks that every local function and data object referenced by a
    /// definition is defined (the JIT would panic while relocating
    /// otherwise).
    #[cfg(any(feature = "jit", feature = "object"))]
    fn check_references_defined(&self) -> cranelift_module::ModuleResult<()> {
        self.ids.check_references_defined(self.inner.declarations())
    }
}

#[cfg(all(test, feature = "jit", feature = "object"))]
mod tests {
    use super::*;

    /// `wrap` decides what the inner module needs by its type, as the
    /// constructors from builders do (a JIT wrapped by hand warm-starts
    /// from entries without unwind information).
    #[test]
    fn wrap_knows_the_inner_module_by_its_type() {
        let options = DedupOptions::default();
        let jit = || {
            cranelift_jit::JITModule::new(
                cranelift_jit::JITBuilder::new(cranelift_module::default_libcall_names()).unwrap(),
            )
        };
        let m = DedupModule::wrap(jit(), options);
        assert!(!m.writes_frames);
        assert_eq!(m.records_exception_tables, jit::records_exception_tables());
        assert!(!m.exports_interposable && !m.preemptible_replaceable);
        let isa = cranelift_codegen::isa::lookup_by_name("x86_64")
            .unwrap()
            .finish(cranelift_codegen::settings::Flags::new(
                cranelift_codegen::settings::builder(),
            ))
            .unwrap();
        let builder = cranelift_object::ObjectBuilder::new(
            isa,
            "kind",
            cranelift_module::default_libcall_names(),
        )
        .unwrap();
        let m = DedupModule::with_options(builder, options);
        assert!(m.writes_frames && !m.records_exception_tables);
        assert!(m.exports_interposable && m.preemptible_replaceable);
        assert!(inner_kind::<DedupModule<cranelift_jit::JITModule>>() == InnerKind::Other);
    }
}
