//! jitfold's own errors: what a [`DedupModule`](super::DedupModule) can
//! fail with beyond what the inner module reports.
//!
//! # What this module guarantees
//!
//! - Every failure that jitfold itself detects is a [`DedupError`], carried
//!   inside `ModuleError::Backend` (the `Module` trait's error type has no
//!   other place for it), so callers keep one error type and can still
//!   match: `err.downcast_ref::<DedupError>()` on the `anyhow::Error`, or
//!   [`DedupError::of`] on the `ModuleError`.
//! - Errors of the inner module and of Cranelift (a verifier error, a
//!   duplicate definition, an incompatible signature, ...) are passed on as
//!   the inner module returns them, so code that matches on them keeps
//!   working.
//! - A panic inside Cranelift, or inside the fingerprint walk, is its own
//!   variant ([`DedupError::CraneliftPanic`], [`DedupError::FingerprintPanic`]),
//!   never `CodegenError::Unsupported`, which Cranelift uses for what it
//!   deliberately does not support.

use core::fmt;
use cranelift_module::{FuncId, ModuleError};

/// A failure detected by jitfold, carried inside `ModuleError::Backend`
/// (find it with [`DedupError::of`]). Errors of the inner module and of
/// Cranelift are passed on as they are; a panic inside Cranelift is
/// [`DedupError::CraneliftPanic`], not `CodegenError::Unsupported`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DedupError {
    /// An entry point or address was asked for a function that is not
    /// defined.
    FunctionNotDefined {
        /// The function's linkage name.
        function: String,
    },
    /// An entry point was asked for a function that is defined but not
    /// finalized yet (or, in batch mode, still pending): call
    /// `finalize_definitions` first.
    FunctionNotFinalized {
        /// The function's linkage name.
        function: String,
    },
    /// The address of a data object was asked for before it was defined.
    DataNotDefined {
        /// The data object's linkage name.
        data: String,
    },
    /// The address of a data object was asked for before it was finalized.
    DataNotFinalized {
        /// The data object's linkage name.
        data: String,
    },
    /// A definition refers to local functions or data objects that are
    /// still undefined when finalizing or finishing (the JIT would panic
    /// while relocating, a linker would fail later).
    ReferencedButNotDefined {
        /// `function NAME` or `data object NAME`, sorted.
        missing: Vec<String>,
    },
    /// Several batch definitions failed (or failed earlier and were neither
    /// defined again nor given up); each is left undefined.
    BatchDefinitionsFailed {
        /// Each failed function with its error's text, oldest first.
        failures: Vec<(FuncId, String)>,
    },
    /// Check mode found code jitfold would hand out that differs from the
    /// function's own compilation; the function is not defined.
    CheckMismatch {
        /// The function being defined.
        function: String,
        /// What it was to be defined as: `a duplicate of`, `reused code
        /// of`, `an adapter for`.
        relation: String,
        /// The function whose code it would get.
        other: String,
        /// What differs (with both disassemblies where the code does).
        difference: String,
    },
    /// Check mode could not compile a function on its own to compare it.
    CheckCompileFailed {
        /// The function being defined.
        function: String,
        /// Cranelift's error.
        message: String,
    },
    /// Cranelift panicked while compiling a function.
    CraneliftPanic {
        /// The function's linkage name.
        function: String,
        /// The panic's message.
        message: String,
    },
    /// The fingerprint walk panicked on a function the verifier accepts
    /// (a bug in jitfold: please report the function).
    FingerprintPanic {
        /// The panic's message.
        message: String,
    },
    /// A function already defined (or recorded, in batch mode) was
    /// declared again so as to become preemptible, or exported where
    /// exports may be interposed (see 14 in the [module docs](crate::module)):
    /// it may already be merged with another, which such a symbol must
    /// never be. Declare it so before defining it.
    PreemptibleAfterDefinition {
        /// The function's linkage name.
        function: String,
    },
    /// The inner module could not resolve a name to an address.
    Unresolved {
        /// The name as given.
        name: String,
        /// The inner module's panic message.
        message: String,
    },
}

impl DedupError {
    /// The `DedupError` inside `error`, if it carries one.
    pub fn of(error: &ModuleError) -> Option<&DedupError> {
        match error {
            ModuleError::Backend(e) => e.downcast_ref::<DedupError>(),
            _ => None,
        }
    }
}

impl fmt::Display for DedupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DedupError::FunctionNotDefined { function } => {
                write!(f, "function {function} is not defined")
            }
            DedupError::FunctionNotFinalized { function } => write!(
                f,
                "function {function} is not finalized yet (call finalize_definitions)"
            ),
            DedupError::DataNotDefined { data } => write!(f, "data object {data} is not defined"),
            DedupError::DataNotFinalized { data } => write!(
                f,
                "data object {data} is not finalized yet (call finalize_definitions)"
            ),
            DedupError::ReferencedButNotDefined { missing } => {
                write!(f, "referenced but not defined: {}", missing.join(", "))
            }
            DedupError::BatchDefinitionsFailed { failures } => {
                let list: Vec<&str> = failures.iter().map(|(_, text)| text.as_str()).collect();
                write!(
                    f,
                    "{} batch definitions failed and are not defined (define them again, or \
                     give them up with take_failed_definitions): {}",
                    list.len(),
                    list.join("; ")
                )
            }
            DedupError::CheckMismatch {
                function,
                relation,
                other,
                difference,
            } => write!(
                f,
                "check mode: {function} was to be defined as {relation} {other}, but {difference}"
            ),
            DedupError::CheckCompileFailed { function, message } => write!(
                f,
                "check mode: {function} does not compile on its own: {message}"
            ),
            DedupError::CraneliftPanic { function, message } => {
                write!(
                    f,
                    "Cranelift panicked while compiling {function}: {message}"
                )
            }
            DedupError::FingerprintPanic { message } => write!(
                f,
                "the fingerprint walk panicked on a function the verifier accepts: {message}"
            ),
            DedupError::PreemptibleAfterDefinition { function } => write!(
                f,
                "{function} cannot become preemptible, or exported where exports may be \
                 interposed, after it was defined (it may be merged already): declare it so \
                 first"
            ),
            DedupError::Unresolved { name, message } => {
                write!(f, "cannot resolve {name}: {message}")
            }
        }
    }
}

impl std::error::Error for DedupError {}

impl From<DedupError> for ModuleError {
    fn from(error: DedupError) -> Self {
        ModuleError::Backend(anyhow::Error::new(error))
    }
}
