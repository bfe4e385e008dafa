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
//!    cycle do not.
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
//!    verified first when the flags enable the verifier, and fingerprinting
//!    never panics (see `verify.rs`); in batch mode a failure stops nothing
//!    else and is reported until dealt with (see `batch.rs`).
//! 8. Misuse is an error, not a panic: defining an undeclared id, an import,
//!    an id twice, or with a signature other than the declared one; in the
//!    JIT, finalizing while a referenced local function or data object is
//!    undefined, and asking for the pointer of an undefined or unfinalized id.
//! 9. With [`DedupOptions::check`], every duplicate, reused code and adapter
//!    is also compiled on its own and compared with the code it is handed;
//!    a difference is an error naming both functions (see `check.rs`).
//! 10. What happens to each function is logged through the `log` crate
//!     (target `jitfold::module`), as Cranelift logs: at debug level each
//!     function's outcome with both names where there are two (compiled,
//!     duplicate of, with whether it shares the address, reused the code
//!     of, adapter for, failed), and late merges; at trace level reference
//!     rewrites, batch recording and refinement.
//!
//! # Where the wrapper sits
//!
//! On a cache hit, and when code is reused, nothing is compiled, so
//! `ctx.compiled_code()` is `None` after `define_function` (Cranelift keeps
//! that field private to its crate, so it cannot be filled in from the
//! canonical function). Wrappers that read
//! the compiled code after each definition (unwind info, disassembly) must
//! therefore be the *inner* module of a `DedupModule`, not wrap it; they then
//! see every function that is actually compiled, and only those. Inner
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

pub mod adapter;
mod address;
mod batch;
mod check;
mod error;
mod jit;
mod join;
mod object;
mod options;
pub mod reuse;
pub mod stats;
pub mod trampoline;
mod unwind;
mod verify;

use crate::cache::{ClassId, DedupCache, Lookup};
use crate::fingerprint::Fingerprinter;
use crate::plan::{ClassFacts, CompiledCache, Outcome, Plan, Policy, Step, WalkRef};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::entity::{EntityRef, SecondaryMap};
use cranelift_codegen::ir::{self, Function};
use cranelift_codegen::{Context, isa};
use cranelift_module::{
    DataDescription, DataId, FuncId, Linkage, Module, ModuleDeclarations, ModuleError, ModuleReloc,
    ModuleRelocTarget, ModuleResult,
};
use hashbrown::{HashMap, HashSet};
use join::{ClassNames, Joins};
use reuse::CodeTemplate;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

#[doc(hidden)]
pub use check::Poison;
pub use error::DedupError;
pub use options::{DedupOptions, Mode};
pub use stats::Stats;

/// What a function id is defined as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Undefined,
    /// Recorded in batch mode, not yet compiled.
    Pending,
    /// Compiled by the inner module, or defined from reused code; the first
    /// of its class.
    Compiled(ClassId),
    /// A duplicate of `canonical` (defined as a trampoline to it, or planned
    /// to be, in batch mode). Whether its address is `canonical`'s is
    /// [`DedupModule::shares_address`].
    Duplicate { canonical: FuncId },
    /// Defined by the user from raw bytes.
    Bytes,
}

/// A `Module` that compiles each distinct function once; see the
/// [module docs](self).
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
    functions: SecondaryMap<FuncId, State>,
    /// Number of function ids declared in the inner module.
    declared_functions: usize,
    /// Number of data ids declared in the inner module.
    declared_data: usize,
    /// Late merges of eager mode (see `join.rs`).
    joins: Joins,
    pending: Vec<(FuncId, Function)>,
    /// The caller's control plane of each pending definition, for its
    /// compilation (see `batch.rs`).
    pending_control: HashMap<FuncId, ControlPlane>,
    /// Batch definitions that failed and are still undefined, with their
    /// errors' text (see `batch.rs`).
    failed: Vec<(FuncId, String)>,
    /// The reference code of each class, in check mode (see `check.rs`).
    reference: check::ReferenceCode,
    /// The size of each defined function's own code (its trampoline, for
    /// a duplicate).
    code_size: SecondaryMap<FuncId, u32>,
    /// The JIT's code ranges, by start address: (end, function); and for
    /// each function with duplicates, its duplicates (see `jit.rs`).
    code_ranges: std::collections::BTreeMap<usize, (usize, FuncId)>,
    duplicates_of: HashMap<FuncId, Vec<FuncId>>,
    /// Functions defined from bytes by jitfold (reused code, trampolines)
    /// with how their frames are described (see `unwind.rs`).
    frames: Vec<(FuncId, unwind::Frame)>,
    /// Functions whose own address was compiled into code or data (see 6
    /// in the module docs): as duplicates they keep it.
    address_taken: SecondaryMap<FuncId, bool>,
    /// Local functions and data objects referenced by definitions so far.
    referenced_functions: HashSet<FuncId>,
    referenced_data: HashSet<DataId>,
    defined_data: SecondaryMap<DataId, bool>,
    /// Ids defined in the inner module since the last finalization.
    unfinalized: Vec<FuncId>,
    finalized: SecondaryMap<FuncId, bool>,
    /// Data objects defined since the last finalization, and those
    /// finalized.
    unfinalized_data: Vec<DataId>,
    finalized_data: SecondaryMap<DataId, bool>,
    stats: Stats,
}

impl<M: Module> DedupModule<M> {
    /// Wraps `inner`. Declarations already made in `inner` are kept.
    /// (`DedupModule::<JITModule>::new` and `DedupModule::<ObjectModule>::new`
    /// make the inner module from its builder, as `JITModule::new` and
    /// `ObjectModule::new` do, with the default options.)
    pub fn wrap(inner: M, options: DedupOptions) -> Self {
        let declared_functions = inner.declarations().get_functions().count();
        let declared_data = inner.declarations().get_data_objects().count();
        let machine_trampolines =
            trampoline::trampoline_to(inner.isa(), FuncId::from_u32(0)).is_some();
        Self {
            inner,
            options,
            compiled: CompiledCache::new(),
            class_canonical: SecondaryMap::new(),
            fingerprinter: Fingerprinter::new(),
            machine_trampolines,
            functions: SecondaryMap::new(),
            declared_functions,
            declared_data,
            joins: Joins::default(),
            pending: Vec::new(),
            pending_control: HashMap::new(),
            failed: Vec::new(),
            reference: check::ReferenceCode::default(),
            address_taken: SecondaryMap::new(),
            code_size: SecondaryMap::new(),
            code_ranges: std::collections::BTreeMap::new(),
            duplicates_of: HashMap::new(),
            frames: Vec::new(),
            referenced_functions: HashSet::new(),
            referenced_data: HashSet::new(),
            defined_data: SecondaryMap::new(),
            unfinalized: Vec::new(),
            finalized: SecondaryMap::new(),
            unfinalized_data: Vec::new(),
            finalized_data: SecondaryMap::new(),
            stats: Stats::default(),
        }
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The wrapped module, mutably. Definitions made on it directly bypass
    /// deduplication and are not known to the wrapper.
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
        match self.state(id) {
            State::Compiled(_) | State::Bytes => Some(id),
            State::Duplicate { canonical } => Some(canonical),
            State::Undefined | State::Pending => None,
        }
    }

    /// Follows duplicate links from `id` to a function that is not a
    /// duplicate. Links always point to earlier definitions or planned ones,
    /// so the chain is at most as long as the number of functions.
    fn root_of(&self, mut id: FuncId) -> FuncId {
        for _ in 0..=self.declared_functions {
            match self.state(id) {
                State::Duplicate { canonical } => id = canonical,
                _ => break,
            }
        }
        id
    }

    fn state(&self, id: FuncId) -> State {
        if id.index() < self.declared_functions {
            self.functions[id]
        } else {
            State::Undefined
        }
    }

    fn function_name(&self, id: FuncId) -> String {
        self.inner
            .declarations()
            .get_function_decl(id)
            .linkage_name(id)
            .into_owned()
    }

    /// Checks that `id` may be defined now, with `signature` when given (raw
    /// bytes carry none).
    fn check_definable(&self, id: FuncId, signature: Option<&ir::Signature>) -> ModuleResult<()> {
        if id.index() >= self.declared_functions {
            return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
        }
        let decl = self.inner.declarations().get_function_decl(id);
        if !decl.linkage.is_definable() {
            return Err(ModuleError::InvalidImportDefinition(self.function_name(id)));
        }
        if self.functions[id] != State::Undefined {
            return Err(ModuleError::DuplicateDefinition(self.function_name(id)));
        }
        if let Some(signature) = signature
            && decl.signature != *signature
        {
            return Err(ModuleError::IncompatibleSignature(
                self.function_name(id),
                decl.signature.clone(),
                signature.clone(),
            ));
        }
        Ok(())
    }

    /// Forgets that a batch definition of `id` failed: it is being defined
    /// again.
    fn forget_failure(&mut self, id: FuncId) {
        if !self.failed.is_empty() {
            self.failed.retain(|(failed, _)| *failed != id);
        }
    }

    /// Notes the local functions and data objects the code just compiled in
    /// `ctx` has relocations against, so that finalizing can check they are
    /// defined. (Declared but unused references are not relocated, so they
    /// need no definition.)
    fn note_references(&mut self, ctx: &Context) {
        let Some(code) = ctx.compiled_code() else {
            return;
        };
        let params = &ctx.func.params;
        for reloc in code.buffer.relocs() {
            let cranelift_codegen::FinalizedRelocTarget::ExternalName(ir::ExternalName::User(r)) =
                reloc.target
            else {
                continue;
            };
            if let Some(name) = params.user_named_funcs().get(r) {
                self.note_reference(&ModuleRelocTarget::user(name.namespace, name.index));
            }
        }
    }

    /// Notes that something defined refers to `target`, so that finalizing
    /// can check that it is defined.
    fn note_reference(&mut self, target: &ModuleRelocTarget) {
        match *target {
            ModuleRelocTarget::User {
                namespace: 0,
                index,
            } => {
                self.referenced_functions.insert(FuncId::from_u32(index));
            }
            ModuleRelocTarget::User {
                namespace: 1,
                index,
            } => {
                self.referenced_data.insert(DataId::from_u32(index));
            }
            _ => {}
        }
    }

    /// What the planner may do in this module.
    fn policy(&self) -> Policy {
        Policy {
            reuse: self.options.reuse,
            machine_trampolines: self.machine_trampolines,
        }
    }

    /// The function that started `class` in this module.
    fn canonical_of(&self, class: ClassId) -> FuncId {
        self.class_canonical[class].expect("every class has its first function")
    }

    /// The facts of the class `id` was compiled (or reused) as, if any.
    fn facts_of(&self, id: FuncId) -> Option<ClassFacts> {
        match self.functions[id] {
            State::Compiled(class) => Some(self.compiled.facts(class)),
            State::Undefined | State::Pending | State::Duplicate { .. } | State::Bytes => None,
        }
    }

    /// Defines `id` now, as [the planner](crate::plan) says: the first
    /// step of its plan that works (a duplicate, reused code, an adapter,
    /// or compiling it in the inner module). Counts the outcome.
    fn define_now(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        // The walk's results stay where the walk left them, so that a
        // cache hit copies nothing; the fingerprinter is out of `self`
        // meanwhile.
        let mut walker = std::mem::take(&mut self.fingerprinter);
        let result = self.define_walked(id, ctx, ctrl_plane, &mut walker);
        self.fingerprinter = walker;
        result
    }

    /// [`DedupModule::define_now`] with `walker` as the fingerprinter.
    fn define_walked(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
        walker: &mut Fingerprinter,
    ) -> ModuleResult<()> {
        let walk = verify::walk_checked(walker, &ctx.func, self.inner.isa())?;
        // Whatever `id` becomes, its code has these addresses in it (a
        // duplicate's are its canonical function's, the same names).
        self.note_addresses_taken(&walk);
        let plan = self.compiled.plan(&walk.planned(&ctx.func), self.policy());
        // Whatever is defined without compiling it is verified first, once.
        let mut verified = false;
        for step in plan.steps() {
            let outcome = match step {
                Step::Duplicate(class) => {
                    self.define_duplicate(id, &ctx.func, class, &mut verified)?
                }
                Step::Reuse(template) => {
                    self.define_reused(id, &walk, template, &ctx.func, &mut verified)?
                }
                Step::Adapter(class) => {
                    self.define_adapter(id, &walk, class, &ctx.func, &mut verified)?
                }
                Step::Compile => break,
            };
            if let Some(outcome) = outcome {
                self.stats.count(&outcome);
                return Ok(());
            }
        }
        let outcome = self.compile(id, ctx, ctrl_plane, &walk, plan)?;
        self.stats.count(&outcome);
        Ok(())
    }

    /// Defines `id` as a duplicate of the compiled function of `class`
    /// (verified and, in check mode, checked first). `None` when the ISA
    /// has no trampoline for it.
    fn define_duplicate(
        &mut self,
        id: FuncId,
        func: &Function,
        class: ClassId,
        verified: &mut bool,
    ) -> ModuleResult<Option<Outcome>> {
        let canonical = self.canonical_of(class);
        self.verify_once(func, verified)?;
        if self.options.check {
            self.check_duplicate(id, func, canonical)?;
        }
        self.define_trampoline(id, canonical)
    }

    /// Compiles `id` in the inner module (the plan's last step), keeping
    /// what the plan says to keep for later functions.
    fn compile(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
        walk: &WalkRef<'_>,
        plan: Plan,
    ) -> ModuleResult<Outcome> {
        // Compiling rewrites `ctx.func`; the check lays out the original.
        let original = self.options.check.then(|| ctx.func.clone());
        let start = Instant::now();
        let inner = &mut self.inner;
        let result = catch_unwind(AssertUnwindSafe(|| {
            inner.define_function_with_control_plane(id, ctx, ctrl_plane)
        }))
        .unwrap_or_else(|panic| Err(compile_panic(self.function_name(id), panic)));
        let time = start.elapsed();
        result?;
        let code_bytes = ctx
            .compiled_code()
            .map_or(0, |c| u64::from(c.code_info().total_size));
        self.note_references(ctx);
        let mut kept_bytes = None;
        if let Some(template) = plan.keep_template
            && let Some(code) = CodeTemplate::capture(id, ctx, walk.names, time, self.inner.isa())
        {
            kept_bytes = Some(code.heap_bytes() as u64);
            self.compiled.keep_template(template, code);
        }
        log::debug!(
            "{} ({id}): compiled, {code_bytes} bytes in {time:?}",
            self.function_name(id)
        );
        self.code_size[id] = code_bytes as u32;
        let facts = ClassFacts {
            code_bytes,
            compile_time: time,
        };
        let class = self.start_class(id, walk, facts);
        if let Some(body) = plan.keep_body {
            let call_conv = self.call_conv(id);
            self.compiled.keep_body(body, class, call_conv);
        }
        if let Some(original) = original {
            self.keep_reference_code(id, &original, crate::code::MachineCode::of(ctx));
        }
        Ok(Outcome::Compiled {
            code_bytes,
            time,
            kept_bytes,
        })
    }

    /// Records `id`, just defined (walked as `walk`; its names kept for
    /// late merges), as the first of its class (unless the class exists
    /// already, when the ISA has no trampolines). Returns the class.
    fn start_class(&mut self, id: FuncId, walk: &WalkRef<'_>, facts: ClassFacts) -> ClassId {
        let fp = walk.fingerprint.to_fingerprint();
        let names = ClassNames::of(&fp, walk.names, walk.address_taken);
        let class = match self.compiled.add_class(fp, facts) {
            Lookup::Duplicate(class) => class,
            Lookup::New(class) => {
                self.class_canonical[class] = Some(id);
                if let Some(names) = names {
                    self.joins.record(class, names);
                }
                class
            }
        };
        self.functions[id] = State::Compiled(class);
        self.unfinalized.push(id);
        class
    }

    /// Defines `id` (walked as `walk`) from the code kept for template
    /// class `template`, if it can be retargeted to `id`'s names; `None`
    /// otherwise.
    fn define_reused(
        &mut self,
        id: FuncId,
        walk: &WalkRef<'_>,
        template: ClassId,
        func: &Function,
        verified: &mut bool,
    ) -> ModuleResult<Option<Outcome>> {
        let code = self.compiled.template_code(template);
        let own_names = walk.names;
        let Some(relocs) = code.instantiate(id, own_names) else {
            return Ok(None);
        };
        self.verify_once(func, verified)?;
        let own = if self.options.check {
            let reused = code.retargeted(own_names);
            let check = reused.map(|reused| self.check_reused(id, func, own_names, &reused, code));
            check.transpose()?
        } else {
            None
        };
        self.inner
            .define_function_bytes(id, code.alignment(), code.bytes(), &relocs)?;
        let code_bytes = code.bytes().len() as u64;
        let saved = code.compile_time;
        let source = code.source;
        if code.unwind.is_some() {
            self.frames
                .push((id, unwind::Frame::Template(template.index())));
        }
        for reloc in &relocs {
            self.note_reference(&reloc.name);
        }
        log::debug!(
            "{} ({id}): reused the code of {} ({source}), {code_bytes} bytes, {} relocations \
             retargeted",
            self.function_name(id),
            self.function_name(source),
            relocs.len()
        );
        self.code_size[id] = code_bytes as u32;
        let facts = ClassFacts {
            code_bytes,
            compile_time: saved,
        };
        self.start_class(id, walk, facts);
        self.keep_reference_code(id, func, own);
        Ok(Some(Outcome::Reused { code_bytes, saved }))
    }

    /// Defines `id` (walked as `walk`) as an [`adapter`] to the compiled
    /// function of `class`, which differs from it only in its calling
    /// convention.
    fn define_adapter(
        &mut self,
        id: FuncId,
        walk: &WalkRef<'_>,
        class: ClassId,
        func: &Function,
        verified: &mut bool,
    ) -> ModuleResult<Option<Outcome>> {
        let target = self.canonical_of(class);
        self.verify_once(func, verified)?;
        let own = if self.options.check {
            Some(self.check_adapter(id, func, target)?)
        } else {
            None
        };
        let (result, time, code_bytes) = self.compile_adapter(id, target);
        result?;
        log::debug!(
            "{} ({id}): adapter for {} ({target}), {code_bytes} bytes",
            self.function_name(id),
            self.function_name(target)
        );
        self.code_size[id] = code_bytes as u32;
        let target_facts = self.facts_of(target);
        let facts = ClassFacts {
            code_bytes,
            compile_time: time,
        };
        self.start_class(id, walk, facts);
        self.keep_reference_code(id, func, own);
        Ok(Some(Outcome::Adapted {
            code_bytes,
            time,
            target: target_facts,
        }))
    }

    /// The calling convention `id` was declared with.
    fn call_conv(&self, id: FuncId) -> isa::CallConv {
        self.inner
            .declarations()
            .get_function_decl(id)
            .signature
            .call_conv
    }

    /// Defines `id` in the inner module as an [`adapter`] (with `id`'s
    /// declared signature) calling `target`. Returns the result, the
    /// compile time and the code size.
    fn compile_adapter(&mut self, id: FuncId, target: FuncId) -> (ModuleResult<()>, Duration, u64) {
        let decls = self.inner.declarations();
        let own = decls.get_function_decl(id).signature.clone();
        let target_sig = decls.get_function_decl(target).signature.clone();
        let config = self.inner.target_config();
        let inner = &mut self.inner;
        let func = adapter::adapter(&own, &target_sig, config, |f| {
            inner.declare_func_in_func(target, f)
        });
        let mut ctx = Context::for_function(func);
        let start = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| inner.define_function(id, &mut ctx)))
            .unwrap_or_else(|panic| Err(compile_panic(self.function_name(id), panic)));
        let time = start.elapsed();
        let code_bytes = ctx
            .compiled_code()
            .map_or(0, |c| u64::from(c.code_info().total_size));
        if result.is_ok() {
            self.note_references(&ctx);
        }
        (result, time, code_bytes)
    }

    /// Defines `id` as a trampoline to `canonical`. Returns `None` (and
    /// defines nothing) when the ISA has no trampoline form.
    fn define_trampoline(
        &mut self,
        id: FuncId,
        canonical: FuncId,
    ) -> ModuleResult<Option<Outcome>> {
        let (trampoline_bytes, trampoline_time) =
            match trampoline::trampoline_to(self.inner.isa(), canonical) {
                Some(t) => {
                    self.inner.define_function_bytes(
                        id,
                        t.alignment,
                        &t.bytes,
                        std::slice::from_ref(&t.reloc),
                    )?;
                    self.frames
                        .push((id, unwind::Frame::Entry(t.bytes.len() as u32)));
                    (t.bytes.len() as u64, Duration::ZERO)
                }
                None => match self.define_tail_trampoline(id, canonical) {
                    Some(compiled) => compiled,
                    None => return Ok(None),
                },
            };
        self.functions[id] = State::Duplicate { canonical };
        self.code_size[id] = trampoline_bytes as u32;
        self.unfinalized.push(id);
        self.referenced_functions.insert(canonical);
        self.join_callers(id, canonical);
        let shares = self.shares_address(id);
        log::debug!(
            "{} ({id}): duplicate of {} ({canonical}), {trampoline_bytes}-byte trampoline; {}",
            self.function_name(id),
            self.function_name(canonical),
            if shares {
                "shares its address"
            } else {
                "keeps its own address"
            }
        );
        Ok(Some(Outcome::Duplicate {
            shares_address: shares,
            trampoline_bytes,
            trampoline_time,
            of: self.facts_of(canonical),
        }))
    }

    /// On an ISA without a machine-code trampoline, defines `id` as a CLIF
    /// `return_call` to `canonical` when both use the `tail` convention
    /// (the callee then returns straight to the caller, as after a jump).
    /// Returns the code size and compile time, or `None` (and defines
    /// nothing) when the conventions are not both `tail` or the ISA cannot
    /// compile it.
    fn define_tail_trampoline(&mut self, id: FuncId, canonical: FuncId) -> Option<(u64, Duration)> {
        let tail = isa::CallConv::Tail;
        if self.call_conv(id) != tail || self.call_conv(canonical) != tail {
            return None;
        }
        match self.compile_adapter(id, canonical) {
            (Ok(()), time, code_bytes) => Some((code_bytes, time)),
            (Err(_), _, _) => None,
        }
    }
    /// Checks that every local function and data object referenced by a
    /// definition is defined (the JIT would panic while relocating otherwise).
    fn check_references_defined(&self) -> ModuleResult<()> {
        let decls = self.inner.declarations();
        let mut missing: Vec<String> = Vec::new();
        for &id in &self.referenced_functions {
            let local = id.index() < self.declared_functions
                && decls.get_function_decl(id).linkage.is_final()
                && decls.get_function_decl(id).linkage != Linkage::Import;
            if local && matches!(self.state(id), State::Undefined | State::Pending) {
                missing.push(format!("function {}", self.function_name(id)));
            }
        }
        for &id in &self.referenced_data {
            let decl = (id.index() < self.declared_data).then(|| decls.get_data_decl(id));
            if let Some(decl) = decl
                && decl.linkage.is_final()
                && !self.defined_data[id]
            {
                missing.push(format!("data object {}", decl.linkage_name(id)));
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            missing.sort();
            Err(DedupError::ReferencedButNotDefined { missing }.into())
        }
    }
}

/// The error for a panic of Cranelift while compiling `function`.
fn compile_panic(function: String, panic: Box<dyn std::any::Any + Send>) -> ModuleError {
    let message = crate::compile::panic_message(&panic);
    DedupError::CraneliftPanic { function, message }.into()
}

impl<M: Module> Module for DedupModule<M> {
    fn isa(&self) -> &dyn isa::TargetIsa {
        self.inner.isa()
    }

    fn declarations(&self) -> &ModuleDeclarations {
        self.inner.declarations()
    }

    fn get_name(&self, name: &str) -> Option<cranelift_module::FuncOrDataId> {
        self.inner.get_name(name)
    }

    fn target_config(&self) -> isa::TargetFrontendConfig {
        self.inner.target_config()
    }

    fn make_context(&self) -> Context {
        self.inner.make_context()
    }

    fn clear_context(&self, ctx: &mut Context) {
        self.inner.clear_context(ctx)
    }

    fn make_signature(&self) -> ir::Signature {
        self.inner.make_signature()
    }

    fn clear_signature(&self, sig: &mut ir::Signature) {
        self.inner.clear_signature(sig)
    }

    fn declare_function(
        &mut self,
        name: &str,
        linkage: Linkage,
        signature: &ir::Signature,
    ) -> ModuleResult<FuncId> {
        let id = self.inner.declare_function(name, linkage, signature)?;
        self.declared_functions = self.declared_functions.max(id.index() + 1);
        Ok(id)
    }

    fn declare_anonymous_function(&mut self, signature: &ir::Signature) -> ModuleResult<FuncId> {
        let id = self.inner.declare_anonymous_function(signature)?;
        self.declared_functions = self.declared_functions.max(id.index() + 1);
        Ok(id)
    }

    fn declare_data(
        &mut self,
        name: &str,
        linkage: Linkage,
        writable: bool,
        tls: bool,
    ) -> ModuleResult<DataId> {
        let id = self.inner.declare_data(name, linkage, writable, tls)?;
        self.declared_data = self.declared_data.max(id.index() + 1);
        Ok(id)
    }

    fn declare_anonymous_data(&mut self, writable: bool, tls: bool) -> ModuleResult<DataId> {
        let id = self.inner.declare_anonymous_data(writable, tls)?;
        self.declared_data = self.declared_data.max(id.index() + 1);
        Ok(id)
    }

    fn declare_func_in_func(&mut self, func_id: FuncId, func: &mut ir::Function) -> ir::FuncRef {
        self.inner.declare_func_in_func(func_id, func)
    }

    fn declare_data_in_func(&self, data: DataId, func: &mut ir::Function) -> ir::GlobalValue {
        self.inner.declare_data_in_func(data, func)
    }

    fn declare_func_in_data(&self, func_id: FuncId, data: &mut DataDescription) -> ir::FuncRef {
        self.inner.declare_func_in_data(func_id, data)
    }

    fn declare_data_in_data(&self, data_id: DataId, data: &mut DataDescription) -> ir::GlobalValue {
        self.inner.declare_data_in_data(data_id, data)
    }

    fn define_function_with_control_plane(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        self.check_definable(id, Some(&ctx.func.signature))?;
        self.forget_failure(id);
        self.canonicalize_references(&mut ctx.func);
        // Counted now; taken back if the definition fails (in batch mode,
        // when `flush` finds out).
        self.stats.defined += 1;
        match self.options.mode {
            Mode::Eager => self.define_now(id, ctx, ctrl_plane).inspect_err(|_| {
                self.stats.defined -= 1;
            }),
            Mode::Batch => {
                log::trace!(
                    "{} ({id}): recorded for the next flush",
                    self.function_name(id)
                );
                self.functions[id] = State::Pending;
                self.pending.push((id, ctx.func.clone()));
                self.pending_control.insert(id, ctrl_plane.clone());
                Ok(())
            }
        }
    }

    fn define_function_bytes(
        &mut self,
        id: FuncId,
        alignment: u64,
        bytes: &[u8],
        relocs: &[ModuleReloc],
    ) -> ModuleResult<()> {
        // Raw bytes carry no signature to compare.
        self.check_definable(id, None)?;
        self.forget_failure(id);
        // A relocation may take an address: one to a duplicate sharing its
        // canonical function's address is made to that function; any other
        // keeps its target's own address.
        let relocs: Vec<ModuleReloc> = relocs
            .iter()
            .map(|r| ModuleReloc {
                name: self
                    .shared_target(&r.name)
                    .unwrap_or_else(|| r.name.clone()),
                ..r.clone()
            })
            .collect();
        self.inner
            .define_function_bytes(id, alignment, bytes, &relocs)?;
        for reloc in &relocs {
            self.note_reference(&reloc.name);
            self.note_address_taken(&reloc.name);
        }
        log::trace!("{} ({id}): defined from bytes", self.function_name(id));
        self.code_size[id] = bytes.len() as u32;
        self.functions[id] = State::Bytes;
        self.unfinalized.push(id);
        self.stats.defined += 1;
        self.stats.bytes_defined += 1;
        Ok(())
    }

    fn define_data(&mut self, data_id: DataId, data: &DataDescription) -> ModuleResult<()> {
        if data_id.index() >= self.declared_data {
            return Err(ModuleError::Undeclared(format!(
                "{data_id} (never declared)"
            )));
        }
        // Function addresses in data: one of a duplicate that shares its
        // canonical function's address is that function's; any other keeps
        // its target's own address.
        let rewritten;
        let data = if data
            .function_decls
            .values()
            .any(|t| self.shared_target(t).is_some())
        {
            let mut copy = data.clone();
            for target in copy.function_decls.values_mut() {
                if let Some(shared) = self.shared_target(target) {
                    *target = shared;
                }
            }
            rewritten = copy;
            &rewritten
        } else {
            data
        };
        self.inner.define_data(data_id, data)?;
        self.defined_data[data_id] = true;
        self.unfinalized_data.push(data_id);
        for target in data.function_decls.values() {
            self.note_reference(target);
            self.note_address_taken(target);
        }
        for target in data.data_decls.values() {
            self.note_reference(target);
        }
        Ok(())
    }
}
