//! Compiling one function to machine code without linking it, for
//! `report --compile` and `report --verify`.
//!
//! # What this module guarantees
//!
//! - [`compile`] never panics: a Cranelift error, and a panic inside
//!   Cranelift (some of its own filetests make a backend panic when compiled
//!   for another ISA or without a CPU feature), are both an `Err` with the
//!   message.
//! - [`MachineCode`] holds everything that decides what the code does once
//!   linked: the bytes, and each relocation's offset, kind, addend and target,
//!   with external names resolved through the function's own name table (so
//!   two functions that number their name tables differently compare equal
//!   when they refer to the same symbols).

use cranelift_codegen::Context;
use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::TargetIsa;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// Machine code of one function, as needed to compare two compilations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineCode {
    /// The code bytes.
    pub bytes: Vec<u8>,
    /// `(offset, kind, addend, target)` of every relocation, in order.
    pub relocs: Vec<(u32, Reloc, i64, String)>,
}

/// A compilation and how long it took.
pub struct Compiled {
    /// The result.
    pub code: MachineCode,
    /// Wall time of `Context::compile`.
    pub time: Duration,
}

/// Compiles a copy of `func` for `isa` with a default control plane.
pub fn compile(func: &Function, isa: &dyn TargetIsa) -> Result<Compiled, String> {
    let mut ctx = Context::for_function(func.clone());
    let start = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        ctx.compile(isa, &mut ControlPlane::default())
            .map(|_| ())
            .map_err(|e| format!("{:?}", e.inner))
    }));
    let time = start.elapsed();
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(panic) => return Err(format!("Cranelift panicked: {}", panic_message(&panic))),
    }
    let code = ctx
        .compiled_code()
        .ok_or_else(|| "no compiled code after a successful compile".to_string())?;
    let relocs = code
        .buffer
        .relocs()
        .iter()
        .map(|r| {
            (
                r.offset,
                r.kind,
                r.addend,
                r.target.display(Some(&ctx.func.params)),
            )
        })
        .collect();
    Ok(Compiled {
        code: MachineCode {
            bytes: code.code_buffer().to_vec(),
            relocs,
        },
        time,
    })
}

/// The text of a panic payload.
pub fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `f` with the panic hook silenced (Cranelift panics that
/// [`compile`] catches would otherwise print a backtrace each), restoring
/// the previous hook afterwards.
pub fn with_quiet_panics<T>(f: impl FnOnce() -> T) -> T {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    match result {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
