//! Verifying what is not compiled, and fingerprinting that cannot panic.
//!
//! The inner module verifies every function it compiles (when the ISA's
//! flags have `enable_verifier` on, the default). A function that
//! [`DedupModule`] defines without compiling it never reaches that check,
//! and the fingerprint ignores what the verifier would reject in unreachable
//! blocks, so a cache hit alone proves nothing about the function.
//!
//! # What this module guarantees
//!
//! 1. [`DedupModule::verify_uncompiled`] runs Cranelift's verifier on a
//!    function that is about to be defined without being compiled (a cache
//!    hit defined as a trampoline or alias, reused code, an adapter, a
//!    planned duplicate in batch mode) when the ISA's flags enable the
//!    verifier, as the inner module would. A function it rejects gets
//!    `ModuleError::Compilation(CodegenError::Verifier(..))`, the error the
//!    inner module returns for it, and the caller defines nothing.
//! 2. [`walk_checked`] never lets a panic of the walk
//!    escape: a walk that panics on a malformed function (say, a jump to a
//!    block that does not exist) becomes the verifier's error for that
//!    function (the verifier then runs whatever the flags say, since it is
//!    the clearest account of what is wrong), or, should the verifier
//!    accept it, [`DedupError::FingerprintPanic`] with the panic message. The
//!    fingerprinter resets its scratch memory at the start of every walk,
//!    so it stays usable after a caught panic.
//!
//! Functions that are compiled are not verified here: the inner module
//! does that (verifying them twice would cost a third of a compile).

use super::{DedupError, DedupModule};
use crate::fingerprint::Fingerprinter;
use crate::plan::WalkRef;
use cranelift_codegen::CodegenError;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use cranelift_module::{Module, ModuleError, ModuleResult};
use std::panic::{AssertUnwindSafe, catch_unwind};

impl<M: Module> DedupModule<M> {
    /// Verifies `func`, which is about to be defined without being
    /// compiled, if the ISA's flags enable the verifier (see 1 above).
    pub(super) fn verify_uncompiled(&self, func: &Function) -> ModuleResult<()> {
        let isa = self.inner.isa();
        if isa.flags().enable_verifier() {
            verify(func, isa)
        } else {
            Ok(())
        }
    }

    /// [`DedupModule::verify_uncompiled`] unless `verified` says it was
    /// done; sets it.
    pub(super) fn verify_once(&self, func: &Function, verified: &mut bool) -> ModuleResult<()> {
        if !*verified {
            self.verify_uncompiled(func)?;
            *verified = true;
        }
        Ok(())
    }
}

/// The walk of `func` by `walker`, or an error if the walk panics on it
/// (see 2 above); `isa` is the module's.
pub(super) fn walk_checked<'w>(
    walker: &'w mut Fingerprinter,
    func: &Function,
    isa: &dyn TargetIsa,
) -> ModuleResult<WalkRef<'w>> {
    // The walk's only state is scratch memory that every walk resets, so
    // it is sound to use it again after a caught panic.
    let outcome = catch_unwind(AssertUnwindSafe(move || {
        let walker = walker;
        WalkRef::of(walker, func)
    }));
    outcome.or_else(|panic| {
        let message = crate::compile::panic_message(&panic);
        verify(func, isa)?;
        Err(DedupError::FingerprintPanic { message }.into())
    })
}

/// Runs Cranelift's verifier on `func` for `isa`, with the inner module's
/// error for a rejected function.
fn verify(func: &Function, isa: &dyn TargetIsa) -> ModuleResult<()> {
    cranelift_codegen::verify_function(func, isa)
        .map_err(|errors| ModuleError::Compilation(CodegenError::Verifier(errors)))
}
