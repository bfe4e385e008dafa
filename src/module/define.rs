//! Carrying out a plan: defining one function in the inner module as
//! [the planner](crate::plan) says, and counting what happened.
//!
//! # What this module guarantees
//!
//! 1. The steps of a plan are tried in order, and the first that works
//!    defines the function; [`Step::Compile`] always applies. A step
//!    declines (and defines nothing) only when the ISA has no trampoline
//!    for a duplicate, kept code cannot be retargeted to the function's
//!    names, the store has no usable entry, or (eager similar merging)
//!    the function's shape has no body to be a thunk of.
//! 2. Whatever is defined without compiling it (a duplicate, reused code,
//!    an adapter) is verified first, once, and in check mode compared with
//!    the function's own compiled code (see `check.rs`).
//! 3. Every definition counts exactly one [`Outcome`] in the statistics,
//!    and a failed one counts none and leaves no cache entry: a panic of
//!    Cranelift while compiling is a [`DedupError::CraneliftPanic`].
//! 4. Only a compiled function keeps what its plan says to keep (its code
//!    for reuse, its body for adapters), after it was defined.

use super::flush::Ahead;
use super::frames::Frame;
use super::ids::State;
use super::join::ClassNames;
use super::parallel::{Compiled, Precompiled};
use super::reuse::CodeTemplate;
use super::verify::Unverified;
use super::{DedupError, DedupModule, adapter, trampoline, verify};
use crate::cache::{ClassId, Lookup};
use crate::code::MachineCode;
use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::plan::{ClassFacts, Outcome, Plan, Step, Walk, WalkRef};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::entity::EntityRef;
use cranelift_codegen::ir::{self, Function};
use cranelift_codegen::{Context, isa};
use cranelift_module::{FuncId, Module, ModuleError, ModuleRelocTarget, ModuleResult};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

impl<M: Module> DedupModule<M> {
    /// Defines `id` now, as [the planner](crate::plan) says: the first
    /// step of its plan that works (a duplicate, reused code, an adapter,
    /// or compiling it: in the inner module, or, if `ahead` holds the
    /// result of compiling `ctx.func` on another thread, by taking that;
    /// code it leaves there was not used).
    /// Counts the outcome. `known` is the walk of `ctx.func` as it is,
    /// if the caller has it (batch mode keeps the walks of a flush's
    /// planning); `None` walks it here. `ahead` also holds the store's
    /// entry for `ctx.func` as it is, checked on a flush's thread, if any.
    pub(super) fn define_now(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
        ahead: &mut Ahead,
        known: Option<&Walk>,
    ) -> ModuleResult<()> {
        // The walk's results stay where the walk left them, so that a
        // cache hit copies nothing; the fingerprinter is out of `self`
        // meanwhile.
        let mut walker = std::mem::take(&mut self.fingerprinter);
        let result = self.define_walked(id, ctx, ctrl_plane, ahead, &mut walker, known);
        self.fingerprinter = walker;
        result
    }

    /// [`DedupModule::define_now`] with `walker` as the fingerprinter.
    fn define_walked(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
        ahead: &mut Ahead,
        walker: &mut Fingerprinter,
        known: Option<&Walk>,
    ) -> ModuleResult<()> {
        let walk = match known {
            Some(walk) => walk.as_ref(),
            None => verify::walk_checked(walker, &ctx.func, self.inner.isa())?,
        };
        // Whatever `id` becomes, its code has these addresses in it (a
        // duplicate's are its canonical function's, the same names).
        self.note_addresses_taken(&walk);
        let plan = self.compiled.plan(&walk.planned(&ctx.func), self.policy());
        // Whatever is defined without compiling it is verified first, once.
        let mut verified = Unverified::new(&walk);
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
                // Code compiled on another thread that the store makes
                // unneeded is left in `precompiled`, and discarded by the
                // caller.
                Step::Load => {
                    self.define_stored(id, &walk, &ctx.func, &plan, ahead, &mut verified)?
                }
                // A thunk of a merged body (see `similar.rs`), defined as
                // a function of its own, which counts its outcome.
                Step::Similar => {
                    let observes_own_frame = walk.observes_own_frame;
                    let thunk = self.eager_thunk(id, &ctx.func, observes_own_frame, ctrl_plane);
                    if let Some(thunk) = thunk {
                        // Its own template is not compiled: a reservation
                        // the store made for it is given up now (the thunk
                        // may turn out a duplicate, which asks the store
                        // nothing).
                        self.end_reservation();
                        return self.define_eager_thunk(id, ctx, thunk, ctrl_plane);
                    }
                    None
                }
                Step::Compile => break,
            };
            if let Some(outcome) = outcome {
                self.stats.count(&outcome);
                return Ok(());
            }
        }
        // The first compile of a module is the inner module's (see 5 in
        // `parallel.rs`).
        let precompiled = ahead.code.take_if(|_| self.frames.inner_compiled());
        let compiled = self.compile(id, ctx, ctrl_plane, &walk, plan, precompiled);
        // A template the store reserved for this module is released if the
        // compile did not store it.
        self.end_reservation();
        let outcome = compiled?;
        self.stats.count(&outcome);
        Ok(())
    }

    /// Compiles `id` in the inner module outside the cache: no key, no
    /// class, no plan, so that no function is ever merged into it nor it
    /// into another, and references to it are never rewritten (see
    /// `forward.rs` on preemptible functions). The functions whose
    /// addresses it uses as data are noted first, as a walk would.
    pub(super) fn compile_alone(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        self.note_addresses_used_as_data(&ctx.func);
        let (time, code_bytes) = self.compile_in_inner(id, ctx, ctrl_plane)?;
        self.ids.defined(id, State::Bytes, code_bytes);
        log::debug!(
            "{} ({id}): compiled outside the cache, {code_bytes} bytes in {time:?}",
            self.function_name(id)
        );
        self.stats.count(&Outcome::Compiled {
            code_bytes,
            time,
            kept_bytes: None,
        });
        Ok(())
    }

    /// Compiles `id` in the inner module (a panic there becomes its
    /// error) and notes what the compile referenced: the compile's time
    /// and code bytes.
    fn compile_in_inner(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<(Duration, u64)> {
        let start = Instant::now();
        let inner = &mut self.inner;
        let result = catch_unwind(AssertUnwindSafe(|| {
            inner.define_function_with_control_plane(id, ctx, ctrl_plane)
        }))
        .unwrap_or_else(|panic| Err(compile_panic(self.function_name(id), panic)));
        let time = start.elapsed();
        result?;
        self.frames.note_inner_compiled();
        let code_bytes = ctx
            .compiled_code()
            .map_or(0, |c| u64::from(c.code_info().total_size));
        self.ids.note_references(ctx);
        Ok((time, code_bytes))
    }

    /// Defines `id` as a duplicate of the compiled function of `class`
    /// (verified and, in check mode, checked first). `None` when the ISA
    /// has no trampoline for it.
    fn define_duplicate(
        &mut self,
        id: FuncId,
        func: &Function,
        class: ClassId,
        verified: &mut Unverified,
    ) -> ModuleResult<Option<Outcome>> {
        // Its code is bound as `id`'s would not be (see `retired.rs`).
        if self.retired.is_retired(class) {
            return Ok(None);
        }
        let canonical = self.canonical_of(class);
        self.verify_once(func, verified)?;
        if self.options.check {
            self.check_duplicate(id, func, canonical)?;
        }
        self.define_trampoline(id, canonical)
    }

    /// Compiles `id` in the inner module (the plan's last step), or
    /// defines the code `precompiled` holds for it, keeping what the plan
    /// says to keep for later functions.
    fn compile(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
        walk: &WalkRef<'_>,
        plan: Plan,
        precompiled: Option<Precompiled>,
    ) -> ModuleResult<Outcome> {
        // Compiling rewrites `ctx.func`; the check lays out the original.
        // (Code compiled on another thread was compiled from a copy.)
        let original = self.options.check.then(|| ctx.func.clone());
        // (Code the plan would not load is not stored either.)
        let stores = self.stored.is_some() && plan.load;
        // What the compile checks, for the entry (see 6 in `verify.rs`):
        // jitfold's own compile on another thread, or an inner module
        // known to compile as given.
        let compile_checks = precompiled.is_some() || self.inner_compile_checks;
        let read_digest = (stores && compile_checks && self.checks_uncompiled())
            .then(|| verify::read_digests(&ctx.func));
        let (time, code_bytes, precompiled) = match precompiled {
            None => {
                let (time, code_bytes) = self.compile_in_inner(id, ctx, ctrl_plane)?;
                (time, code_bytes, None)
            }
            Some(precompiled) => {
                let compiled = self.define_precompiled(id, precompiled)?;
                (compiled.time, compiled.code_bytes, Some(compiled))
            }
        };
        if stores {
            self.store_compiled(
                ctx,
                precompiled.as_ref(),
                walk,
                plan.keep_template.clone(),
                time,
                read_digest,
            );
        }
        let mut kept_bytes = None;
        if let Some(template) = plan.keep_template {
            let code = match &precompiled {
                None => CodeTemplate::capture(id, ctx, walk.names, time, self.inner.isa()),
                Some(c) => {
                    CodeTemplate::from_parts(id, c.code.clone(), walk.names, time, c.unwind.clone())
                }
            };
            if let Some(code) = code {
                kept_bytes = Some(code.heap_bytes() as u64);
                self.compiled.keep_template(template, code);
            }
        }
        log::debug!(
            "{} ({id}): compiled, {code_bytes} bytes in {time:?}",
            self.function_name(id)
        );
        let facts = ClassFacts {
            code_bytes,
            compile_time: time,
        };
        let class = self.start_class(id, walk, facts, plan.fingerprint);
        if let Some(body) = plan.keep_body {
            let call_conv = self.call_conv(id);
            self.compiled.keep_body(body, class, call_conv);
        }
        let machine_code = match precompiled {
            None => original.as_ref().and_then(|_| MachineCode::of(ctx)),
            Some(compiled) => {
                // Its frame, for object files (see `unwind.rs`).
                if let Some(unwind) = compiled.unwind {
                    self.frames.push_own(id, unwind);
                }
                Some(compiled.code)
            }
        };
        if let Some(original) = original {
            self.keep_reference_code(id, &original, machine_code);
        }
        Ok(Outcome::Compiled {
            code_bytes,
            time,
            kept_bytes,
        })
    }

    /// Defines `id` in the inner module from the code `precompiled` holds
    /// for it (see `parallel.rs`), or returns the error compiling it in the
    /// inner module would have returned. Notes its references.
    fn define_precompiled(
        &mut self,
        id: FuncId,
        precompiled: Precompiled,
    ) -> ModuleResult<Compiled> {
        let compiled =
            precompiled.map_err(|failure| failure.into_error(|| self.function_name(id)))?;
        let inner = &mut self.inner;
        catch_unwind(AssertUnwindSafe(|| {
            inner.define_function_bytes(
                id,
                u64::from(compiled.code.alignment),
                &compiled.code.bytes,
                &compiled.relocs,
            )
        }))
        .unwrap_or_else(|panic| Err(compile_panic(self.function_name(id), panic)))?;
        for reloc in &compiled.relocs {
            self.ids.note_reference(&reloc.name);
        }
        Ok(compiled)
    }

    /// Records `id`, just defined (walked as `walk`; its names kept for
    /// late merges), as the first of its class (unless the class exists
    /// already, when the ISA has no trampolines), with `owned` as the
    /// class's key where the plan copied the walk's fingerprint already
    /// (copied here otherwise). Returns the class.
    pub(super) fn start_class(
        &mut self,
        id: FuncId,
        walk: &WalkRef<'_>,
        facts: ClassFacts,
        owned: Option<Fingerprint>,
    ) -> ClassId {
        debug_assert!(
            owned
                .as_ref()
                .is_none_or(|fp| fp.key() == walk.fingerprint.key())
        );
        let fp = owned.unwrap_or_else(|| walk.fingerprint.to_fingerprint());
        let names = ClassNames::of(&fp, walk.names, walk.address_taken);
        let class = match self.compiled.add_class(fp, facts) {
            // A retired class's next function takes its place (see
            // `retired.rs`).
            Lookup::Duplicate(class) if self.retired.is_retired(class) => {
                self.class_canonical[class] = Some(id);
                self.retired.start(class, walk.names);
                class
            }
            Lookup::Duplicate(class) => class,
            Lookup::New(class) => {
                self.class_canonical[class] = Some(id);
                if let Some(names) = names {
                    self.joins.record(class, names);
                }
                self.retired.start(class, walk.names);
                class
            }
        };
        self.ids
            .defined(id, State::Compiled(class), facts.code_bytes);
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
        verified: &mut Unverified,
    ) -> ModuleResult<Option<Outcome>> {
        let own_names = walk.names;
        let Some(relocs) = self
            .compiled
            .template_code(template)
            .instantiate(id, own_names)
        else {
            return Ok(None);
        };
        self.verify_once(func, verified)?;
        let code = self.compiled.template_code(template);
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
            self.frames.push(id, Frame::Template(template.index()));
        }
        for reloc in &relocs {
            self.ids.note_reference(&reloc.name);
        }
        log::debug!(
            "{} ({id}): reused the code of {} ({source}), {code_bytes} bytes, {} relocations \
             retargeted",
            self.function_name(id),
            self.function_name(source),
            relocs.len()
        );
        let facts = ClassFacts {
            code_bytes,
            compile_time: saved,
        };
        self.start_class(id, walk, facts, None);
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
        verified: &mut Unverified,
    ) -> ModuleResult<Option<Outcome>> {
        // Its code is bound as `id`'s would not be (see `retired.rs`).
        if self.retired.is_retired(class) {
            return Ok(None);
        }
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
        let target_facts = self.facts_of(target);
        let facts = ClassFacts {
            code_bytes,
            compile_time: time,
        };
        self.start_class(id, walk, facts, None);
        self.keep_reference_code(id, func, own);
        Ok(Some(Outcome::Adapted {
            code_bytes,
            time,
            target: target_facts,
        }))
    }

    /// The signature `id` was defined (or recorded) with, which need not
    /// be the declared one (see `ids.rs`).
    pub(super) fn signature(&self, id: FuncId) -> &ir::Signature {
        self.ids.signature(self.inner.declarations(), id)
    }

    /// The calling convention `id` was defined (or recorded) with.
    pub(super) fn call_conv(&self, id: FuncId) -> isa::CallConv {
        self.signature(id).call_conv
    }

    /// Defines `id` in the inner module as an [`adapter`] (with the
    /// signature `id` is defined with) calling `target` (with its own).
    /// Returns the result, the compile time and the code size.
    fn compile_adapter(&mut self, id: FuncId, target: FuncId) -> (ModuleResult<()>, Duration, u64) {
        let own = self.signature(id).clone();
        let target_sig = self.signature(target).clone();
        let config = self.inner.target_config();
        let inner = &mut self.inner;
        let func = adapter::adapter(&own, &target_sig, config, |f| {
            // Called with the signature it was defined with, not the
            // declared one `declare_func_in_func` imports.
            let callee = inner.declare_func_in_func(target, f);
            f.dfg.ext_funcs[callee].signature = f.import_signature(target_sig.clone());
            callee
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
            self.frames.note_inner_compiled();
            self.ids.note_references(&ctx);
        }
        (result, time, code_bytes)
    }

    /// Defines `id` as a trampoline to `canonical`. Returns `None` (and
    /// defines nothing) when the ISA has no trampoline form.
    pub(super) fn define_trampoline(
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
                    self.frames.push(id, Frame::Entry(t.bytes.len() as u32));
                    (t.bytes.len() as u64, Duration::ZERO)
                }
                None => match self.define_tail_trampoline(id, canonical) {
                    Some(compiled) => compiled,
                    None => return Ok(None),
                },
            };
        self.ids
            .defined(id, State::Duplicate { canonical }, trampoline_bytes);
        self.ids
            .note_reference(&ModuleRelocTarget::user(0, canonical.as_u32()));
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
}

/// The error for a panic of Cranelift while compiling `function`.
pub(super) fn compile_panic(function: String, panic: Box<dyn std::any::Any + Send>) -> ModuleError {
    let message = crate::compile::panic_message(&panic);
    DedupError::CraneliftPanic { function, message }.into()
}

/// Runs `pass`, part of what compiling `func` does, with a panic as the
/// error compiling `func` gives for it. (The panic hook sees the panic, as
/// it would in plain Cranelift: the library leaves the process's hook
/// alone.)
pub(super) fn panic_as_error<T>(
    func: &Function,
    pass: impl FnOnce() -> ModuleResult<T>,
) -> ModuleResult<T> {
    std::panic::catch_unwind(AssertUnwindSafe(pass))
        .unwrap_or_else(|panic| Err(compile_panic(func.name.to_string(), panic)))
}
