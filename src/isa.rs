//! Building Cranelift target ISAs by name, with errors instead of panics.
//!
//! # What this module guarantees
//!
//! - [`isa_by_name`] never panics: a malformed triple, an architecture
//!   Cranelift does not implement (e.g. `i686`), an architecture left out of
//!   this build, and invalid settings are each a distinct [`IsaError`].

use crate::fingerprint::CRANELIFT_VERSION;
use core::fmt;
use core::str::FromStr;
use cranelift_codegen::isa::{self, LookupError, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use target_lexicon::Triple;

/// Why an ISA could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IsaError {
    /// The name is not a target triple.
    BadTriple(String, String),
    /// Cranelift has no backend for this architecture.
    Unsupported(String),
    /// Cranelift has a backend, but this build of jitfold left it out.
    Disabled(String),
    /// The backend rejected the flags.
    Settings(String, String),
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsaError::BadTriple(name, e) => write!(f, "`{name}` is not a target triple: {e}"),
            IsaError::Unsupported(name) => {
                write!(
                    f,
                    "Cranelift {CRANELIFT_VERSION} has no backend for `{name}`"
                )
            }
            IsaError::Disabled(name) => write!(
                f,
                "the `{name}` backend is not built in (enable the `all-targets` feature)"
            ),
            IsaError::Settings(name, e) => write!(f, "invalid settings for `{name}`: {e}"),
        }
    }
}

impl std::error::Error for IsaError {}

/// Shared flags: Cranelift's defaults with each `(name, value)` applied.
pub fn flags(settings: &[(&str, &str)]) -> Result<settings::Flags, IsaError> {
    let mut builder = settings::builder();
    for (name, value) in settings {
        builder
            .set(name, value)
            .map_err(|e| IsaError::Settings(format!("{name}={value}"), e.to_string()))?;
    }
    Ok(settings::Flags::new(builder))
}

/// The flags wasmtime and most JITs compile with: `opt_level=speed`, and
/// frame pointers kept (needed by `get_frame_pointer` and by `return_call`
/// on x86-64).
pub fn jit_flags() -> settings::Flags {
    flags(&[("opt_level", "speed"), ("preserve_frame_pointers", "true")])
        .expect("both settings exist in the Cranelift jitfold is built against")
}

/// The ISA for a triple such as `x86_64`, `aarch64` or
/// `aarch64-unknown-linux-gnu`, with the baseline CPU features.
pub fn isa_by_name(name: &str, flags: settings::Flags) -> Result<OwnedTargetIsa, IsaError> {
    let triple =
        Triple::from_str(name).map_err(|e| IsaError::BadTriple(name.into(), e.to_string()))?;
    isa_for_triple(triple, flags)
}

/// The ISA of the machine jitfold runs on, with the baseline CPU features.
pub fn host_isa(flags: settings::Flags) -> Result<OwnedTargetIsa, IsaError> {
    isa_for_triple(Triple::host(), flags)
}

fn isa_for_triple(triple: Triple, flags: settings::Flags) -> Result<OwnedTargetIsa, IsaError> {
    let name = triple.to_string();
    let builder = isa::lookup(triple).map_err(|e| match e {
        LookupError::SupportDisabled => IsaError::Disabled(name.clone()),
        LookupError::Unsupported => IsaError::Unsupported(name.clone()),
    })?;
    builder
        .finish(flags)
        .map_err(|e| IsaError::Settings(name, e.to_string()))
}
