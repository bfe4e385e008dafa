//! The JIT-only calls of a [`DedupModule`] around a `JITModule`: the same
//! inherent methods as `JITModule`, with the same signatures, plus `try_…`
//! versions that return errors where `JITModule` panics.
//!
//! # What this module guarantees
//!
//! - `DedupModule<JITModule>` has every public inherent method of
//!   `JITModule` 0.135.8 with the same signature ([`DedupModule::new`],
//!   [`DedupModule::finalize_definitions`],
//!   [`DedupModule::get_finalized_function`],
//!   [`DedupModule::get_finalized_data`], [`DedupModule::get_address`],
//!   [`DedupModule::free_memory`]), so code written against `JITModule`
//!   compiles when only the type changes (`lookup_wasmtime_exception_data`
//!   exists only with cranelift-jit's `wasmtime-unwinder` feature, which
//!   jitfold does not enable).
//! - Those methods panic where `JITModule`'s do (a function or data object
//!   not defined or not finalized, a name that does not resolve), with the
//!   message of the [`DedupError`] that the `try_…` method returns instead.
//! - `finalize_definitions` returns an error where `JITModule` would panic
//!   while relocating (a referenced local function or data object is not
//!   defined).
//! - The address of a function id is the same whichever way it is
//!   obtained: see [`DedupModule::address_of`].
//! - [`DedupModule::functions_at`] maps a code address back to every
//!   function id whose code runs there. Where Cranelift writes a perf map
//!   (`PERF_BUILDID_DIR` set), every id's name is listed at the address it
//!   resolves to: the inner module lists each compiled function and
//!   trampoline under its own name, and finalizing adds the name of each
//!   duplicate that shares its canonical function's entry point there.

use super::ids::State;
use super::retired::Named;
use super::{DedupError, DedupModule, DedupOptions};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{
    DataId, FuncId, Linkage, Module, ModuleDeclarations, ModuleError, ModuleRelocTarget,
    ModuleResult,
};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Appends `lines` to the perf map `JITModule` writes
/// (`/tmp/perf-PID.map`, when `PERF_BUILDID_DIR` is set); a failure to
/// write only loses profiler names.
fn write_perf_map(lines: &str) {
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut file) = file {
        let _ = file.write_all(lines.as_bytes());
    }
}

impl super::InnerBuilder for JITBuilder {
    type Module = JITModule;
    fn build(self) -> JITModule {
        JITModule::new(self)
    }
}

impl DedupModule<JITModule> {
    /// Like `JITModule::new`: a new JIT module, wrapped with the default
    /// [`DedupOptions`]. (To wrap a module with other options, use
    /// [`DedupModule::wrap`].)
    pub fn new(builder: JITBuilder) -> Self {
        Self::with_options(builder, DedupOptions::default())
    }

    /// Compiles pending batch definitions, checks that everything referenced
    /// is defined, then performs relocations and makes the code executable
    /// (as `JITModule::finalize_definitions`, which would panic where this
    /// returns an error).
    pub fn finalize_definitions(&mut self) -> ModuleResult<()> {
        self.flush()?;
        self.check_references_defined()?;
        self.retire_bound_to_host();
        self.inner.finalize_definitions()?;
        let perf_map = cfg!(unix) && std::env::var_os("PERF_BUILDID_DIR").is_some();
        let mut perf_lines = String::new();
        for id in self.ids.finalize() {
            let start = self.inner.get_finalized_function(id) as usize;
            let end = start + self.ids.code_size(id);
            self.code_map.insert(start, end, id);
            if let State::Duplicate { .. } = self.ids.state(id) {
                let root = self.ids.root_of(id);
                self.code_map.add_duplicate(root, id);
                // The inner module lists the trampoline under `id`'s name;
                // a shared entry point serves `id` too.
                if perf_map && self.shares_address(id) {
                    let (root_start, (root_end, _)) = self.code_range_of(root);
                    perf_lines.push_str(&format!(
                        "{root_start:x} {:x} {}\n",
                        root_end - root_start,
                        self.function_name(id)
                    ));
                }
            }
        }
        if !perf_lines.is_empty() {
            write_perf_map(&perf_lines);
        }
        Ok(())
    }

    /// Retires the classes whose code this finalize binds to a host symbol
    /// for a preemptible function or data object the module does not
    /// define, so that no
    /// later function runs that code (see `retired.rs`).
    fn retire_bound_to_host(&mut self) {
        let decls = self.inner.declarations();
        let bound_to_host = |named: &Named| match *named {
            Named::Function(id) => {
                self.ids.is_declared(id)
                    && decls.get_function_decl(id).linkage == Linkage::Preemptible
                    && !matches!(
                        self.ids.state(id),
                        State::Compiled(_) | State::Duplicate { .. } | State::Bytes
                    )
            }
            Named::Data(id) => {
                self.ids.is_declared_data(id)
                    && decls.get_data_decl(id).linkage == Linkage::Preemptible
                    && !self.ids.is_data_defined(id)
            }
        };
        let mut retire = Vec::new();
        for &id in self.ids.unfinalized() {
            if let State::Compiled(class) = self.ids.state(id)
                && self.class_canonical[class] == Some(id)
                && self.retired.names(class).iter().any(bound_to_host)
            {
                retire.push(class);
            }
        }
        for class in retire {
            self.retire(class);
        }
    }

    /// The entry point of the finalized function `id` (see the
    /// [module docs](super) for what a duplicate's is).
    ///
    /// # Panics
    ///
    /// Where `JITModule::get_finalized_function` panics: when `id` is not
    /// defined or not finalized. [`DedupModule::try_get_finalized_function`]
    /// returns the error instead.
    pub fn get_finalized_function(&self, func_id: FuncId) -> *const u8 {
        self.try_get_finalized_function(func_id)
            .unwrap_or_else(|e| panic!("get_finalized_function: {e}"))
    }

    /// [`DedupModule::get_finalized_function`], with an error instead of
    /// a panic.
    pub fn try_get_finalized_function(&self, id: FuncId) -> ModuleResult<*const u8> {
        if !self.ids.is_declared(id) {
            return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
        }
        let state = self.ids.state(id);
        let function = || self.function_name(id);
        match state {
            State::Undefined => {
                return Err(DedupError::FunctionNotDefined {
                    function: function(),
                }
                .into());
            }
            State::Pending | State::Planned { .. } => {
                return Err(DedupError::FunctionNotFinalized {
                    function: function(),
                }
                .into());
            }
            State::Compiled(_) | State::Duplicate { .. } | State::Bytes => {}
        }
        if !self.ids.is_finalized(id) {
            return Err(DedupError::FunctionNotFinalized {
                function: function(),
            }
            .into());
        }
        Ok(self.inner.get_finalized_function(self.address_id(id)))
    }

    /// The address and size of the finalized data object `data_id`.
    ///
    /// # Panics
    ///
    /// Where `JITModule::get_finalized_data` panics: when the object is not
    /// defined or not finalized. [`DedupModule::try_get_finalized_data`]
    /// returns the error instead.
    pub fn get_finalized_data(&self, data_id: DataId) -> (*const u8, usize) {
        self.try_get_finalized_data(data_id)
            .unwrap_or_else(|e| panic!("get_finalized_data: {e}"))
    }

    /// [`DedupModule::get_finalized_data`], with an error instead of a
    /// panic.
    pub fn try_get_finalized_data(&self, id: DataId) -> ModuleResult<(*const u8, usize)> {
        if !self.ids.is_declared_data(id) {
            return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
        }
        let data = || {
            let decl = self.inner.declarations().get_data_decl(id);
            decl.linkage_name(id).into_owned()
        };
        if !self.ids.is_data_defined(id) {
            return Err(DedupError::DataNotDefined { data: data() }.into());
        }
        if !self.ids.is_data_finalized(id) {
            return Err(DedupError::DataNotFinalized { data: data() }.into());
        }
        Ok(self.inner.get_finalized_data(id))
    }

    /// The address `name` resolves to, as `JITModule::get_address`: for a
    /// local function the address every reference to it gets (see the
    /// [module docs](super)), for a data object its address, otherwise
    /// what the JIT's symbol lookup finds.
    ///
    /// # Panics
    ///
    /// Where `JITModule::get_address` panics: when the name does not
    /// resolve. [`DedupModule::try_get_address`] returns the error instead.
    pub fn get_address(&self, name: &ModuleRelocTarget) -> *const u8 {
        self.try_get_address(name)
            .unwrap_or_else(|e| panic!("get_address: {e}"))
    }

    /// [`DedupModule::get_address`], with an error instead of a panic.
    pub fn try_get_address(&self, name: &ModuleRelocTarget) -> ModuleResult<*const u8> {
        if let ModuleRelocTarget::User { .. } = name {
            if ModuleDeclarations::is_function(name) {
                let id = FuncId::from_name(name);
                if !self.ids.is_declared(id) {
                    return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
                }
                if self.ids.state(id) == State::Pending {
                    return Err(DedupError::FunctionNotFinalized {
                        function: self.function_name(id),
                    }
                    .into());
                }
                let target = self.address_id(id);
                if target != id {
                    let target = ModuleRelocTarget::user(0, target.as_u32());
                    return self.inner_address(&target);
                }
            } else if !self.ids.is_declared_data(DataId::from_name(name)) {
                let id = DataId::from_name(name);
                return Err(ModuleError::Undeclared(format!("{id} (never declared)")));
            }
        }
        self.inner_address(name)
    }

    /// The inner module's `get_address`, with its panic caught.
    fn inner_address(&self, name: &ModuleRelocTarget) -> ModuleResult<*const u8> {
        // `get_address` only reads the module, apart from caching symbol
        // lookups in a `RefCell` that a panic leaves consistent.
        catch_unwind(AssertUnwindSafe(|| self.inner.get_address(name))).map_err(|panic| {
            DedupError::Unresolved {
                name: format!("{name:?}"),
                message: crate::compile::panic_message(&panic),
            }
            .into()
        })
    }

    /// Every function id whose code runs at `address`, the function that
    /// owns the code there first: for a compiled function's code, that
    /// function and every duplicate of it (they run its code, through
    /// their trampolines or at its entry point); for a trampoline, its
    /// duplicate alone; empty if no finalized function's code is there.
    /// For backtraces and profilers: a shared entry point serves several
    /// names.
    pub fn functions_at(&self, address: *const u8) -> Vec<FuncId> {
        self.code_map.functions_at(address as usize)
    }

    /// The code range of the finalized function `id`, as (start, (end, id)).
    fn code_range_of(&self, id: FuncId) -> (usize, (usize, FuncId)) {
        let start = self.inner.get_finalized_function(id) as usize;
        (start, (start + self.ids.code_size(id), id))
    }

    /// Frees the memory of all compiled code and data, as
    /// `JITModule::free_memory`.
    ///
    /// # Safety
    ///
    /// As for `JITModule::free_memory`: every pointer obtained from this
    /// module is invalid afterwards, so none of its functions may be
    /// running, and none of its function pointers may be called again.
    pub unsafe fn free_memory(self) {
        // SAFETY: the caller upholds the inner module's contract, which is
        // this method's.
        unsafe { self.inner.free_memory() }
    }
}

/// Whether this build of cranelift-jit records the exception tables of the
/// functions it compiles: whether its `wasmtime-unwinder` feature is on,
/// which gives `JITModule` an inherent `lookup_wasmtime_exception_data`.
/// Method lookup prefers an inherent method to a trait's, so the closure
/// below names that method when it exists, and otherwise this function's
/// stand-in, whose answer has another type; the closure is never called,
/// only the type of what it would return is read.
pub(crate) fn records_exception_tables() -> bool {
    /// What the stand-in answers.
    struct NotRecorded;
    /// The stand-in, for builds without the feature (unused in the others).
    #[allow(dead_code)]
    trait WithoutUnwinder {
        fn lookup_wasmtime_exception_data(&self, _pc: usize) -> NotRecorded {
            NotRecorded
        }
    }
    impl WithoutUnwinder for JITModule {}
    /// Which method the closure names, by the type of its answer.
    trait Answer {
        const RECORDED: bool;
    }
    impl Answer for Option<NotRecorded> {
        const RECORDED: bool = false;
    }
    impl<T> Answer for Option<Option<T>> {
        const RECORDED: bool = true;
    }
    fn recorded<A: Answer>(_: &A) -> bool {
        A::RECORDED
    }
    recorded(&None::<&JITModule>.map(|module| module.lookup_wasmtime_exception_data(0)))
}

#[cfg(test)]
mod tests {
    /// The probe sees cranelift-jit's feature: off as this crate is built,
    /// on with `--features cranelift-jit/wasmtime-unwinder`, where `.ci/run`
    /// sets `JITFOLD_EXPECT_EXCEPTION_TABLES=1`.
    #[test]
    fn the_probe_sees_whether_exception_tables_are_recorded() {
        let expected =
            std::env::var_os("JITFOLD_EXPECT_EXCEPTION_TABLES").is_some_and(|v| v == "1");
        assert_eq!(super::records_exception_tables(), expected);
    }
}
