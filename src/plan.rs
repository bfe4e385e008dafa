//! The policy, decided in one place: what to do with a function, given its
//! walk and what was compiled before.
//!
//! [`CompiledCache::plan`] reads the cache (never writes it) and returns a
//! [`Plan`]: the ways to define the function that apply, in the order they
//! are tried: duplicate of a compiled class, a copy of the code of a
//! function with the same template, an adapter for a function that differs
//! only in its calling convention, its code from a code store, and
//! compiling it, which always applies.
//! Whoever carries a plan out ([`crate::DedupModule`], the report, the
//! benchmarks) tries its [`Plan::steps`] in order and takes the first that
//! works; a step may decline only for a reason the plan cannot see (an ISA
//! without a trampoline form, code whose relocations cannot be retargeted).
//! What happened is an [`Outcome`], from which the statistics are counted in
//! one place ([`crate::Stats::count`]).
//!
//! # What this module guarantees
//!
//! 1. A plan depends only on the walk of the function, the [`Policy`] and
//!    the cache: planning is pure, and a lookup needs no `&mut`.
//! 2. A duplicate is planned only for a fingerprint that is a key of a
//!    compiled class. With machine-code trampolines, a duplicate is the
//!    whole plan (it cannot decline).
//! 3. Code is reused only with [`Policy::reuse`], for a function with the
//!    template of a function whose code was kept; a function without names
//!    has no other names, so with machine-code trampolines its code is
//!    neither looked up nor kept.
//! 4. An adapter is planned only for an adaptable function
//!    ([`crate::module::adapter::adaptable`]) whose fingerprint with the
//!    calling convention erased is a compiled function's, of another
//!    calling convention.
//! 5. With [`Policy::store`], loading the function's code from the code
//!    store ([`Step::Load`]) is planned right before compiling it, whenever
//!    compiling is; never for a function a duplicate step stands for alone.
//!    Neither loading nor reuse is planned for a function whose code must
//!    come from compiling it (see [`Planned::compiled_only`]).
//! 6. The cache holds only what holds in any module: keys, code templates,
//!    code sizes and compile times (function ids belong to the module).
//!    Class ids are the exact cache's; every class has its facts.
//! 7. A flush's [forecast](CompiledCache::forecast) is, for each of its
//!    functions in definition order, its plan against the cache as it is
//!    before the flush defines anything, and whether it is the first of
//!    the flush with its exact key and, where its plan keeps them, its
//!    template and its body: a later one is served by what the define
//!    pass keeps of the first (a duplicate, reused code or an adapter).
//!    It is what every phase of a batch flush asks of "will this function
//!    need code?" (the store's prefetch, similar merging, the compile
//!    threads), decided in this one place.
//! 8. With [`Policy::similar`], [`Step::Similar`] (eager similar-function
//!    merging) is planned right before compiling, after loading, whenever
//!    compiling is; never for a function a duplicate step stands for
//!    alone.
//! 9. How a definition starts is decided before anything of it is walked
//!    ([`admission`]): a function the linker may replace (preemptible, or
//!    exported where exports are interposable) is [`Admission::Alone`]
//!    in either mode, compiled at once outside the cache (never walked,
//!    planned, recorded for a flush or stored: never a duplicate, nor what
//!    a duplicate runs); any other is planned now in eager mode (unless
//!    another module sharing the store is compiling its template: then it
//!    is left to the next flush, see 8 in `module/stored.rs`) and recorded
//!    for the next flush in batch mode.

use crate::Mode;
use crate::cache::{ClassId, DedupCache, Lookup};
use crate::fingerprint::{
    BorrowedFingerprint, ErasedConvention, Fingerprint, Fingerprinter, Probe, SymbolName, Template,
};
use cranelift_codegen::entity::{EntityRef, SecondaryMap};
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::CallConv;
use hashbrown::{HashMap, HashSet};
use std::time::Duration;

/// What the walk of one function found: everything the planner (and the
/// module's bookkeeping) needs from it.
#[derive(Clone, Debug)]
pub struct Walk {
    /// The exact key.
    pub fingerprint: Fingerprint,
    /// The names the function uses, in slot order.
    pub names: Vec<SymbolName>,
    /// For each name, whether the function uses its address as data.
    pub address_taken: Vec<bool>,
    /// Whether the function observes its own frame.
    pub observes_own_frame: bool,
    /// Whether its key is unique ([`crate::Walk::key_is_unique`]).
    pub key_is_unique: bool,
    /// Whether every value its instructions name exists
    /// ([`crate::Walk::named_values_exist`]).
    pub named_values_exist: bool,
    /// Whether every alias of its value table names a value in the table
    /// that is no alias, so that resolving its aliases (which compiling
    /// does) follows one link from each: for the check of a function
    /// defined without compiling it (`module/aliases.rs`). A walk leaves
    /// it `false`, which says nothing; the module sets it where it reads
    /// the value table while the function is in the CPU's caches.
    pub alias_chains_short: bool,
}

impl Walk {
    /// Walks `func` with `walker`, keeping what it found.
    pub fn of(walker: &mut Fingerprinter, func: &Function) -> Walk {
        WalkRef::of(walker, func).to_owned()
    }

    /// Whether this walk found what `other` did: the same key, names and
    /// facts (but [`Walk::alias_chains_short`], which the module sets, not
    /// the walk).
    pub fn finds_as(&self, other: &Walk) -> bool {
        let Walk {
            fingerprint,
            names,
            address_taken,
            observes_own_frame,
            key_is_unique,
            named_values_exist,
            alias_chains_short: _,
        } = self;
        *fingerprint == other.fingerprint
            && *names == other.names
            && *address_taken == other.address_taken
            && *observes_own_frame == other.observes_own_frame
            && *key_is_unique == other.key_is_unique
            && *named_values_exist == other.named_values_exist
    }

    /// This walk, borrowed.
    pub fn as_ref(&self) -> WalkRef<'_> {
        WalkRef {
            fingerprint: self.fingerprint.borrowed(),
            names: &self.names,
            address_taken: &self.address_taken,
            observes_own_frame: self.observes_own_frame,
            key_is_unique: self.key_is_unique,
            named_values_exist: self.named_values_exist,
            alias_chains_short: self.alias_chains_short,
        }
    }

    /// What the planner needs of this walk of `func`.
    pub fn planned<'a>(&'a self, func: &Function) -> Planned<'a> {
        self.as_ref().planned(func)
    }
}

/// [`Walk`] borrowed from the [`Fingerprinter`] that walked (until its next
/// walk): what a cache hit needs, without copying the key.
#[derive(Clone, Copy)]
pub struct WalkRef<'a> {
    /// The exact key.
    pub fingerprint: BorrowedFingerprint<'a>,
    /// The names the function uses, in slot order.
    pub names: &'a [SymbolName],
    /// For each name, whether the function uses its address as data.
    pub address_taken: &'a [bool],
    /// Whether the function observes its own frame.
    pub observes_own_frame: bool,
    /// Whether its key is unique ([`crate::Walk::key_is_unique`]).
    pub key_is_unique: bool,
    /// Whether every value its instructions name exists
    /// ([`crate::Walk::named_values_exist`]).
    pub named_values_exist: bool,
    /// Whether every alias of its value table names a value in the table
    /// that is no alias, so that resolving its aliases (which compiling
    /// does) follows one link from each: for the check of a function
    /// defined without compiling it (`module/aliases.rs`). A walk leaves
    /// it `false`, which says nothing; the module sets it where it reads
    /// the value table while the function is in the CPU's caches.
    pub alias_chains_short: bool,
}

impl<'a> WalkRef<'a> {
    /// The key words of the function's template, borrowed
    /// ([`BorrowedFingerprint::template_key`]).
    pub fn template_key(&self) -> &'a [u32] {
        self.fingerprint.template_key()
    }

    /// Walks `func` with `walker`. (The one place that reads the walk's
    /// results.)
    pub fn of(walker: &'a mut Fingerprinter, func: &Function) -> WalkRef<'a> {
        let walk = walker.walk(func);
        WalkRef {
            fingerprint: walk.key(),
            names: walk.names(),
            address_taken: walk.address_taken(),
            observes_own_frame: walk.observes_own_frame(),
            key_is_unique: walk.key_is_unique(),
            named_values_exist: walk.named_values_exist(),
            alias_chains_short: false,
        }
    }

    /// The walk, owned.
    pub fn to_owned(&self) -> Walk {
        Walk {
            fingerprint: self.fingerprint.to_fingerprint(),
            names: self.names.to_vec(),
            address_taken: self.address_taken.to_vec(),
            observes_own_frame: self.observes_own_frame,
            key_is_unique: self.key_is_unique,
            named_values_exist: self.named_values_exist,
            alias_chains_short: self.alias_chains_short,
        }
    }

    /// What the planner needs of this walk of `func`.
    pub fn planned(&self, func: &Function) -> Planned<'a> {
        Planned {
            fingerprint: self.fingerprint,
            names: self.names,
            call_conv: func.signature.call_conv,
            adaptable: crate::module::adapter::adaptable(
                func,
                self.fingerprint.instructions(),
                self.observes_own_frame,
            ),
            catches: !func.dfg.exception_tables.is_empty(),
            key_is_unique: self.key_is_unique,
        }
    }
}

/// What the planner reads about a function.
#[derive(Clone, Copy)]
pub struct Planned<'a> {
    /// Its exact key, where the walk left it (a cache hit copies nothing).
    pub fingerprint: BorrowedFingerprint<'a>,
    /// Its names in slot order.
    pub names: &'a [SymbolName],
    /// Its calling convention.
    pub call_conv: CallConv,
    /// Whether an adapter may stand for it.
    pub adaptable: bool,
    /// Whether it has exception tables (`try_call`, `try_call_indirect`),
    /// which only the inner module's compile may record (see
    /// [`Policy::compile_catching`]).
    pub catches: bool,
    /// Whether its key is unique ([`crate::Walk::key_is_unique`]), which it
    /// is only within this process.
    pub key_is_unique: bool,
}

impl Planned<'_> {
    /// Whether its code must come from the inner module compiling it (or a
    /// trampoline to such code), never from code defined from bytes:
    /// compiled on another thread, reused from another function's, or
    /// loaded from a store (see [`Policy::compile_catching`]).
    pub fn compiled_by_inner(&self, policy: Policy) -> bool {
        self.catches && policy.compile_catching
    }

    /// Whether its code must come from compiling it, in this process
    /// (on any thread), never from another function's or a store's: when
    /// [`Planned::compiled_by_inner`], and when its key is unique.
    pub fn compiled_only(&self, policy: Policy) -> bool {
        self.key_is_unique || self.compiled_by_inner(policy)
    }
}

/// What the options and the target allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Reuse compiled code for functions with the same template.
    pub reuse: bool,
    /// The ISA has a machine-code trampoline, so that every duplicate can
    /// be defined as one.
    pub machine_trampolines: bool,
    /// A code store is consulted before compiling (see [`crate::store`]).
    pub store: bool,
    /// The inner module records the exception tables (by which a throw
    /// finds its handler) of the functions it compiles, and has none for
    /// code defined from bytes, so a function with exception tables must
    /// be compiled by it: cranelift-jit with its `wasmtime-unwinder`
    /// feature, and any module jitfold does not know. (cranelift-object
    /// writes no exception tables, nor does cranelift-jit without that
    /// feature.)
    pub compile_catching: bool,
    /// Eager mode merges similar functions
    /// ([`DedupOptions::with_similar`](crate::DedupOptions::with_similar),
    /// not in check mode, nor while a merged body or thunk is itself
    /// being defined): a function about to be compiled may be defined as
    /// a thunk of a merged body instead.
    pub similar: bool,
}

/// How a definition starts (9 in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Compiled at once, outside the cache: the linker may replace the
    /// function, so a call of it must stay a call of it, and no other
    /// function may run its code.
    Alone,
    /// Walked and planned at once ([`CompiledCache::plan`]): eager mode
    /// (or left to the next flush, if another module sharing the store is
    /// compiling its template).
    Now,
    /// Recorded for the next flush, which plans it with the others: batch
    /// mode.
    Flush,
}

/// How a definition in `mode` starts, for a function the linker may
/// replace (`replaceable`) or not (9 in the module docs).
pub fn admission(mode: Mode, replaceable: bool) -> Admission {
    match (replaceable, mode) {
        (true, Mode::Eager | Mode::Batch) => Admission::Alone,
        (false, Mode::Eager) => Admission::Now,
        (false, Mode::Batch) => Admission::Flush,
    }
}

/// A way to define a function, as [`Plan::steps`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A duplicate of the compiled function of this class.
    Duplicate(ClassId),
    /// A copy of the code kept for this template class, retargeted.
    Reuse(ClassId),
    /// An adapter calling the compiled function of this class.
    Adapter(ClassId),
    /// Its code from the code store's entry for its template, if it has a
    /// usable one.
    Load,
    /// A thunk of a merged body of its shape, if its shape has one or now
    /// gets one (eager similar-function merging; the step declines for
    /// what only the function's shape and the shapes seen before tell).
    Similar,
    /// Compile it.
    Compile,
}

/// The ways to define one function, in the order to try them, and what to
/// keep should it be compiled.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The class it is an exact duplicate of.
    pub duplicate_of: Option<ClassId>,
    /// The template class whose code it may reuse.
    pub reuse: Option<ClassId>,
    /// The class it may be an adapter for.
    pub adapter_for: Option<ClassId>,
    /// Its template, when its code is to be kept for reuse if compiled.
    pub keep_template: Option<Template>,
    /// Its fingerprint with the calling convention erased, when it is to be
    /// found by adapters if compiled.
    pub keep_body: Option<ErasedConvention>,
    /// Its fingerprint, copied out of the walk once where the plan keeps
    /// its template or body, which share its words: what the class it
    /// starts, if it starts one, holds as its key.
    pub fingerprint: Option<Fingerprint>,
    /// Whether to try the code store before compiling.
    pub load: bool,
    /// Whether to try a thunk of a merged body before compiling.
    pub similar: bool,
}

/// A [`Plan`] whose kept keys are still borrowed from the walk (see
/// [`CompiledCache::decide`]).
struct Decided<'a> {
    duplicate_of: Option<ClassId>,
    reuse: Option<ClassId>,
    adapter_for: Option<ClassId>,
    keep_template: Option<Probe<'a, Template>>,
    keep_body: Option<Probe<'a, ErasedConvention>>,
    load: bool,
    similar: bool,
}

impl Decided<'_> {
    /// As [`Plan::needs_code`].
    fn needs_code(&self) -> bool {
        needs_code(self.duplicate_of, self.reuse, self.adapter_for)
    }
}

/// Whether a function planned as a duplicate of `duplicate_of`, reusing
/// `reuse` and adapting `adapter_for` needs code: none of them is planned.
fn needs_code(
    duplicate_of: Option<ClassId>,
    reuse: Option<ClassId>,
    adapter_for: Option<ClassId>,
) -> bool {
    duplicate_of.is_none() && reuse.is_none() && adapter_for.is_none()
}

impl Plan {
    /// The steps to try, in order; the last is [`Step::Compile`].
    pub fn steps(&self) -> impl Iterator<Item = Step> + use<> {
        [
            self.duplicate_of.map(Step::Duplicate),
            self.reuse.map(Step::Reuse),
            self.adapter_for.map(Step::Adapter),
            self.load.then_some(Step::Load),
            self.similar.then_some(Step::Similar),
            Some(Step::Compile),
        ]
        .into_iter()
        .flatten()
    }

    /// Whether no code of this module serves it (no duplicate, reuse or
    /// adapter step): it is loaded from the code store or compiled.
    pub fn needs_code(&self) -> bool {
        needs_code(self.duplicate_of, self.reuse, self.adapter_for)
    }
}

/// What carrying out a plan did, with what the statistics count.
#[derive(Clone, Copy, Debug)]
pub enum Outcome {
    /// Defined as a duplicate (a trampoline, or an alias).
    Duplicate {
        /// Whether its id shares its canonical function's address.
        shares_address: bool,
        /// Bytes of its trampoline.
        trampoline_bytes: u64,
        /// Time spent compiling the trampoline (one in CLIF, on an ISA
        /// without a machine-code form).
        trampoline_time: Duration,
        /// The class whose code it runs, if compiled.
        of: Option<ClassFacts>,
    },
    /// Defined from a retargeted copy of kept code.
    Reused {
        /// Bytes of code.
        code_bytes: u64,
        /// What compiling the kept code took.
        saved: Duration,
    },
    /// Defined from an entry of a code store (see [`crate::store`]).
    Loaded {
        /// Bytes of code.
        code_bytes: u64,
        /// What compiling the code took where it was compiled.
        saved: Duration,
    },
    /// Defined as an adapter.
    Adapted {
        /// Bytes of the adapter.
        code_bytes: u64,
        /// Time spent compiling it.
        time: Duration,
        /// The class it calls, if compiled.
        target: Option<ClassFacts>,
    },
    /// Compiled.
    Compiled {
        /// Bytes of code.
        code_bytes: u64,
        /// Time spent compiling.
        time: Duration,
        /// Heap bytes of the code kept for reuse, if kept.
        kept_bytes: Option<u64>,
    },
}

/// What holds for a class in any module.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassFacts {
    /// Bytes of its code.
    pub code_bytes: u64,
    /// Time its code took to compile.
    pub compile_time: Duration,
}

/// What the define pass of a flush will need for one of its functions,
/// foreseen before the flush defines anything ([`CompiledCache::forecast`],
/// 7 in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Foreseen {
    /// Its plan needs code ([`Plan::needs_code`]): from the store or a
    /// compile, unless a function before it in the flush provides it.
    pub needs_code: bool,
    /// Its plan tries the store before compiling ([`Plan::load`]).
    pub load: bool,
    /// No function before it in the flush has its exact key, nor, where its
    /// plan keeps them, its template or its body.
    pub first: bool,
}

impl Foreseen {
    /// Whether the define pass gets its code from the store or from
    /// compiling it: it needs code, and no function defined before it in
    /// the flush stands for it.
    pub fn gets_own_code(&self) -> bool {
        self.needs_code && self.first
    }
}

/// Compiled results, independent of any module: exact keys with their
/// classes' facts, templates with their kept code (`T`), and the keys of
/// adaptable functions with the calling convention erased.
pub struct CompiledCache<T> {
    exact: DedupCache,
    facts: SecondaryMap<ClassId, ClassFacts>,
    templates: DedupCache<Template>,
    /// The code of each template class, numbered like `templates` (pushed
    /// in [`CompiledCache::keep_template`] only, with the insert).
    code: Vec<T>,
    bodies: HashMap<ErasedConvention, (ClassId, CallConv)>,
}

impl<T> Default for CompiledCache<T> {
    fn default() -> Self {
        Self {
            exact: DedupCache::new(),
            facts: SecondaryMap::new(),
            templates: DedupCache::new(),
            code: Vec::new(),
            bodies: HashMap::new(),
        }
    }
}

impl<T> CompiledCache<T> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The plan for the function `f` under `policy` (see the module docs).
    pub fn plan(&self, f: &Planned<'_>, policy: Policy) -> Plan {
        let decided = self.decide(f, policy);
        // The keys kept, copied out of the walk once.
        let keeps = decided.keep_template.is_some() || decided.keep_body.is_some();
        let fingerprint = keeps.then(|| f.fingerprint.to_fingerprint());
        let owned = fingerprint.as_ref();
        Plan {
            duplicate_of: decided.duplicate_of,
            reuse: decided.reuse,
            adapter_for: decided.adapter_for,
            keep_template: decided
                .keep_template
                .and(owned)
                .map(Fingerprint::to_template),
            keep_body: decided
                .keep_body
                .and(owned)
                .map(Fingerprint::erase_call_conv),
            load: decided.load,
            similar: decided.similar,
            fingerprint,
        }
    }

    /// What [`CompiledCache::plan`] decides for `f`, the keys it keeps
    /// still borrowed from the walk: every lookup is by a probe, so
    /// deciding copies no key.
    fn decide<'a>(&self, f: &Planned<'a>, policy: Policy) -> Decided<'a> {
        let duplicate_of = self.exact.get_borrowed(&f.fingerprint);
        if duplicate_of.is_some() && policy.machine_trampolines {
            return Decided {
                duplicate_of,
                reuse: None,
                adapter_for: None,
                keep_template: None,
                keep_body: None,
                load: false,
                similar: false,
            };
        }
        let reusable = policy.reuse
            && !f.compiled_only(policy)
            && (!f.names.is_empty() || !policy.machine_trampolines);
        let template = reusable.then(|| f.fingerprint.template_probe());
        let reuse = template.and_then(|t| self.templates.get_probe(&t));
        let body = f.adaptable.then(|| f.fingerprint.erased_probe());
        let adapter_for = body
            .and_then(|b| self.bodies.get(&b))
            .filter(|(_, call_conv)| *call_conv != f.call_conv)
            .map(|(class, _)| *class);
        Decided {
            duplicate_of,
            reuse,
            adapter_for,
            keep_template: template.filter(|_| reuse.is_none()),
            keep_body: body,
            load: policy.store && !f.compiled_only(policy),
            similar: policy.similar,
        }
    }

    /// The forecast of a flush (7 in the module docs): for each of its
    /// functions, in definition order, what the define pass will need
    /// ([`Foreseen`]); `None` where `flush` gives `None` (a function not
    /// planned here: defined already, or not walkable). Pure, as
    /// [`CompiledCache::plan`] is, and copies no key.
    pub fn forecast<'a>(
        &self,
        flush: impl IntoIterator<Item = Option<Planned<'a>>>,
        policy: Policy,
    ) -> Vec<Option<Foreseen>> {
        // What the define pass keeps of the functions before each one.
        let mut exact = HashSet::new();
        let mut templates = HashSet::new();
        let mut bodies = HashSet::new();
        flush
            .into_iter()
            .map(|f| {
                let f = f?;
                let decided = self.decide(&f, policy);
                let needs_code = decided.needs_code();
                let new_key = exact.insert(f.fingerprint.probe());
                let new_template = decided.keep_template.is_none_or(|t| templates.insert(t));
                let new_body = decided.keep_body.is_none_or(|b| bodies.insert(b));
                Some(Foreseen {
                    needs_code,
                    load: decided.load,
                    first: new_key && new_template && new_body,
                })
            })
            .collect()
    }

    /// The class of `fp`, if it is a key.
    pub fn class_of(&self, fp: &Fingerprint) -> Option<ClassId> {
        self.exact.get(fp)
    }

    /// The facts of `class`.
    pub fn facts(&self, class: ClassId) -> ClassFacts {
        self.facts[class]
    }

    /// The kept code of template class `template`.
    pub fn template_code(&self, template: ClassId) -> &T {
        &self.code[template.index()]
    }

    /// Every kept code, by template class index.
    pub fn template_codes(&self) -> &[T] {
        &self.code
    }

    /// Takes every kept code out (the templates stay keys).
    pub fn take_template_codes(&mut self) -> Vec<T> {
        std::mem::take(&mut self.code)
    }

    /// The exact keys and their classes.
    pub fn exact(&self) -> &DedupCache {
        &self.exact
    }

    /// Records a function just defined with fingerprint `fp` (and `facts`,
    /// should it start a class); returns its class, new or not.
    pub fn add_class(&mut self, fp: Fingerprint, facts: ClassFacts) -> Lookup {
        let found = self.exact.get_or_insert(fp);
        if let Lookup::New(class) = found {
            self.facts[class] = facts;
        }
        found
    }

    /// Makes `fp` a second key of `class`; false (changing nothing) if it
    /// is a key already or the class does not exist.
    pub fn add_alias(&mut self, fp: Fingerprint, class: ClassId) -> bool {
        self.exact.insert_alias(fp, class)
    }

    /// Keeps `code` for `template` (absent: see [`Plan::keep_template`]);
    /// returns its template class, or `None` (keeping nothing) if the
    /// template has code already.
    pub fn keep_template(&mut self, template: Template, code: T) -> Option<ClassId> {
        match self.templates.get_or_insert(template) {
            Lookup::Duplicate(_) => None,
            Lookup::New(class) => {
                self.code.push(code);
                Some(class)
            }
        }
    }

    /// Makes `template` a second key of template class `class`.
    pub fn alias_template(&mut self, template: Template, class: ClassId) -> bool {
        self.templates.insert_alias(template, class)
    }

    /// Records `body` (a fingerprint with the calling convention erased)
    /// as `class`'s, of convention `call_conv`, unless it has one.
    pub fn keep_body(&mut self, body: ErasedConvention, class: ClassId, call_conv: CallConv) {
        self.bodies.entry(body).or_insert((class, call_conv));
    }

    /// Makes `body` `class`'s, whatever it was (a test hook's poison).
    pub fn replace_body(&mut self, body: ErasedConvention, class: ClassId, call_conv: CallConv) {
        self.bodies.insert(body, (class, call_conv));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 9: a function the linker may replace is compiled alone in either
    /// mode; any other is planned now or at the flush, as the mode says.
    #[test]
    fn a_replaceable_function_is_admitted_alone_in_either_mode() {
        assert_eq!(admission(Mode::Eager, true), Admission::Alone);
        assert_eq!(admission(Mode::Batch, true), Admission::Alone);
        assert_eq!(admission(Mode::Eager, false), Admission::Now);
        assert_eq!(admission(Mode::Batch, false), Admission::Flush);
    }

    /// `(i64) -> i64` in `conv`: `steps` additions of `k`, then a call of
    /// `callee` (none if `callee` is `None`).
    fn function(conv: &str, steps: usize, k: i64, callee: Option<u32>) -> Function {
        let mut text = format!("function %f(i64) -> i64 {conv} {{\n");
        if let Some(callee) = callee {
            text.push_str(&format!(
                "    sig0 = (i64) -> i64\n    fn0 = u0:{callee} sig0\n"
            ));
        }
        text.push_str(&format!("block0(v0: i64):\n    v1000 = iconst.i64 {k}\n"));
        for i in 0..steps {
            text.push_str(&format!("    v{} = iadd v{i}, v1000\n", i + 1));
        }
        let last = steps;
        if callee.is_some() {
            text.push_str(&format!("    v{} = call fn0(v{last})\n", last + 1));
            text.push_str(&format!("    return v{}\n}}", last + 1));
        } else {
            text.push_str(&format!("    return v{last}\n}}"));
        }
        cranelift_reader::parse_functions(&text).unwrap().remove(0)
    }

    fn walk(func: &Function) -> Walk {
        Walk::of(&mut Fingerprinter::new(), func)
    }

    const ALL_ON: Policy = Policy {
        reuse: true,
        machine_trampolines: true,
        store: true,
        compile_catching: false,
        similar: false,
    };

    /// `func`'s walk recorded as compiled in `cache` (its code kept for
    /// reuse and its body for adapters, as a module keeps them).
    fn compiled(cache: &mut CompiledCache<()>, func: &Function) -> ClassId {
        let w = walk(func);
        let plan = cache.plan(&w.planned(func), ALL_ON);
        let class = cache
            .add_class(w.fingerprint.clone(), ClassFacts::default())
            .class();
        if let Some(template) = plan.keep_template {
            cache.keep_template(template, ());
        }
        if let Some(body) = plan.keep_body {
            cache.keep_body(body, class, func.signature.call_conv);
        }
        class
    }

    fn steps(plan: &Plan) -> Vec<Step> {
        plan.steps().collect()
    }

    /// 1: the plan depends on the walk, the policy and the cache only.
    #[test]
    fn planning_is_pure() {
        let mut cache = CompiledCache::new();
        let f = function("system_v", 20, 1, Some(1));
        compiled(&mut cache, &f);
        let g = function("system_v", 20, 1, Some(2));
        let w = walk(&g);
        let first = format!("{:?}", cache.plan(&w.planned(&g), ALL_ON));
        let again = format!("{:?}", cache.plan(&walk(&g).planned(&g), ALL_ON));
        assert_eq!(first, again);
    }

    /// 2: a duplicate only for a key of a compiled class; with machine
    /// trampolines it is the whole plan.
    #[test]
    fn a_duplicate_is_planned_for_a_compiled_key_only() {
        let mut cache = CompiledCache::new();
        let f = function("system_v", 3, 1, None);
        let w = walk(&f);
        assert_eq!(cache.plan(&w.planned(&f), ALL_ON).duplicate_of, None);
        let class = compiled(&mut cache, &f);
        let plan = cache.plan(&w.planned(&f), ALL_ON);
        // Nothing else is tried, or kept (compiling, always last, is never
        // reached: a trampoline does not decline).
        assert_eq!(steps(&plan), [Step::Duplicate(class), Step::Compile]);
        assert!(plan.keep_template.is_none() && plan.keep_body.is_none());
        // Without trampolines the duplicate may decline: compiling follows.
        let without = Policy {
            machine_trampolines: false,
            ..ALL_ON
        };
        let plan = cache.plan(&w.planned(&f), without);
        assert_eq!(steps(&plan).first(), Some(&Step::Duplicate(class)));
        assert_eq!(steps(&plan).last(), Some(&Step::Compile));
        // Another constant is another key.
        let other = function("system_v", 3, 2, None);
        let plan = cache.plan(&walk(&other).planned(&other), ALL_ON);
        assert_eq!(plan.duplicate_of, None);
    }

    /// 3: code is reused only with `reuse`, for the template of a function
    /// whose code was kept; a function without names keeps none where
    /// trampolines serve its duplicates.
    #[test]
    fn code_is_reused_for_a_kept_template_only() {
        let mut cache = CompiledCache::new();
        let f = function("system_v", 3, 1, Some(1));
        compiled(&mut cache, &f);
        let g = function("system_v", 3, 1, Some(2));
        let w = walk(&g);
        let plan = cache.plan(&w.planned(&g), ALL_ON);
        assert_eq!(plan.duplicate_of, None);
        assert!(matches!(steps(&plan)[0], Step::Reuse(_)), "{plan:?}");
        assert!(plan.keep_template.is_none(), "kept already");
        let no_reuse = Policy {
            reuse: false,
            ..ALL_ON
        };
        let plan = cache.plan(&w.planned(&g), no_reuse);
        assert_eq!(plan.reuse, None);
        assert!(plan.keep_template.is_none());
        // No names: nothing to retarget, so nothing kept or looked up.
        let leaf = function("system_v", 3, 5, None);
        let plan = cache.plan(&walk(&leaf).planned(&leaf), ALL_ON);
        assert!(plan.keep_template.is_none() && plan.reuse.is_none());
        let without = Policy {
            machine_trampolines: false,
            ..ALL_ON
        };
        let plan = cache.plan(&walk(&leaf).planned(&leaf), without);
        assert!(plan.keep_template.is_some());
    }

    /// 4: an adapter only for an adaptable function whose body, the
    /// convention erased, was compiled in another convention.
    #[test]
    fn an_adapter_is_planned_for_another_convention_only() {
        let mut cache = CompiledCache::new();
        let long = crate::module::adapter::MIN_INSTRUCTIONS as usize;
        let class = compiled(&mut cache, &function("system_v", long, 1, None));
        let tail = function("tail", long, 1, None);
        let plan = cache.plan(&walk(&tail).planned(&tail), ALL_ON);
        assert_eq!(steps(&plan)[0], Step::Adapter(class));
        // The same convention is a duplicate, not an adapter (also where
        // the duplicate may decline).
        let same = function("system_v", long, 1, None);
        let without = Policy {
            machine_trampolines: false,
            ..ALL_ON
        };
        let plan = cache.plan(&walk(&same).planned(&same), without);
        assert_eq!(plan.adapter_for, None);
        assert_eq!(plan.duplicate_of, Some(class));
        // Too short to be worth an extra call.
        let mut cache = CompiledCache::new();
        compiled(&mut cache, &function("system_v", 2, 1, None));
        let short = function("tail", 2, 1, None);
        let plan = cache.plan(&walk(&short).planned(&short), ALL_ON);
        assert_eq!(plan.adapter_for, None);
    }

    /// 8: with `similar`, a thunk is tried right before compiling, after
    /// loading, whenever compiling is planned; never where a duplicate
    /// stands alone.
    #[test]
    fn a_similar_step_comes_right_before_compiling() {
        let mut cache = CompiledCache::new();
        let similar = Policy {
            similar: true,
            ..ALL_ON
        };
        let f = function("system_v", 3, 1, Some(1));
        let w = walk(&f);
        let plan = cache.plan(&w.planned(&f), similar);
        assert_eq!(steps(&plan), [Step::Load, Step::Similar, Step::Compile]);
        let plan = cache.plan(&w.planned(&f), ALL_ON);
        assert_eq!(steps(&plan), [Step::Load, Step::Compile]);
        // After reuse, which may decline.
        compiled(&mut cache, &f);
        let g = function("system_v", 3, 1, Some(2));
        let plan = cache.plan(&walk(&g).planned(&g), similar);
        let planned = steps(&plan);
        assert!(matches!(planned[0], Step::Reuse(_)), "{plan:?}");
        assert_eq!(planned[1..], [Step::Load, Step::Similar, Step::Compile]);
        // A duplicate stands alone.
        let plan = cache.plan(&w.planned(&f), similar);
        assert_eq!(steps(&plan).len(), 2, "{plan:?}");
        assert!(!plan.similar);
    }

    /// 5: loading comes right before compiling, whenever compiling is
    /// planned and the code may come from elsewhere; never for a function
    /// a duplicate stands for alone, nor one whose code must be compiled.
    #[test]
    fn loading_comes_right_before_compiling() {
        let mut cache = CompiledCache::new();
        let f = function("system_v", 3, 1, Some(1));
        let w = walk(&f);
        let plan = cache.plan(&w.planned(&f), ALL_ON);
        assert_eq!(steps(&plan), [Step::Load, Step::Compile]);
        let no_store = Policy {
            store: false,
            ..ALL_ON
        };
        assert_eq!(
            steps(&cache.plan(&w.planned(&f), no_store)),
            [Step::Compile]
        );
        // Code that must come from compiling it: neither loaded nor reused.
        for (unique, catches) in [(true, false), (false, true)] {
            let planned = Planned {
                key_is_unique: unique,
                catches,
                ..w.planned(&f)
            };
            let catching = Policy {
                compile_catching: true,
                ..ALL_ON
            };
            let plan = cache.plan(&planned, catching);
            assert_eq!(steps(&plan), [Step::Compile], "{unique} {catches}");
            assert!(plan.keep_template.is_none());
        }
        compiled(&mut cache, &f);
        let plan = cache.plan(&w.planned(&f), ALL_ON);
        assert!(!plan.load, "a duplicate with a trampoline loads nothing");
    }

    /// 6: a class's facts are kept with it.
    #[test]
    fn every_class_has_its_facts() {
        let mut cache: CompiledCache<()> = CompiledCache::new();
        let f = function("system_v", 3, 1, None);
        let facts = ClassFacts {
            code_bytes: 42,
            compile_time: Duration::from_micros(7),
        };
        let class = cache.add_class(walk(&f).fingerprint, facts).class();
        assert_eq!(cache.facts(class), facts);
        assert_eq!(cache.class_of(&walk(&f).fingerprint), Some(class));
    }

    /// 7: a forecast is each function's plan against the cache before the
    /// flush, and a function is first unless one before it has its key,
    /// or, where its plan keeps them, its template or its body.
    #[test]
    fn a_forecast_is_each_plan_and_who_comes_first() {
        let long = crate::module::adapter::MIN_INSTRUCTIONS as usize;
        let mut cache = CompiledCache::new();
        let old = function("system_v", long, 9, None);
        compiled(&mut cache, &old);
        let flush = [
            function("system_v", long, 9, None), // a duplicate of `old`
            function("system_v", long, 1, Some(1)),
            function("system_v", long, 1, Some(2)), // the template of the one before
            function("system_v", long, 1, Some(1)), // its exact key
            function("system_v", long, 2, None),
            function("tail", long, 2, None), // its body, another convention
            function("system_v", long, 3, None),
        ];
        let walks: Vec<Walk> = flush.iter().map(walk).collect();
        let planned = |skip: usize| {
            walks
                .iter()
                .zip(&flush)
                .enumerate()
                .map(move |(i, (w, f))| (i != skip).then(|| w.planned(f)))
        };
        let seen = |policy: Policy, skip: usize| -> Vec<Option<(bool, bool, bool)>> {
            cache
                .forecast(planned(skip), policy)
                .into_iter()
                .map(|f| f.map(|f| (f.needs_code, f.load, f.first)))
                .collect()
        };
        // Each needs code as its own plan says.
        for (i, f) in cache
            .forecast(planned(usize::MAX), ALL_ON)
            .iter()
            .enumerate()
        {
            let plan = cache.plan(&walks[i].planned(&flush[i]), ALL_ON);
            let f = f.expect("planned");
            assert_eq!(
                (f.needs_code, f.load),
                (plan.needs_code(), plan.load),
                "{i}"
            );
            assert_eq!(f.gets_own_code(), f.needs_code && f.first);
        }
        let (code, dup) = (Some((true, true, true)), Some((false, false, true)));
        let later = Some((true, true, false));
        assert_eq!(
            seen(ALL_ON, usize::MAX),
            [dup, code, later, later, code, later, code]
        );
        // Without reuse a template stands for nothing: the third is first.
        let no_reuse = Policy {
            reuse: false,
            ..ALL_ON
        };
        assert_eq!(
            seen(no_reuse, usize::MAX),
            [dup, code, code, later, code, later, code]
        );
        // A function not planned here is `None`, and stands for nothing.
        assert_eq!(seen(ALL_ON, 1), [dup, None, code, later, code, later, code]);
        assert_eq!(seen(ALL_ON, 4), [dup, code, later, later, None, code, code]);
        // Pure: the cache was not changed.
        assert_eq!(seen(ALL_ON, 1), seen(ALL_ON, 1));
        assert_eq!(cache.exact().classes(), 1);
    }
}
