//! The machine-code oracle: compiling one function without linking it, and
//! deciding whether two functions compile to the same machine code (check
//! mode, `report --verify`, the fuzzer).
//!
//! # What this module guarantees
//!
//! - [`compile`] never panics: a Cranelift error, and a panic inside
//!   Cranelift (some of its own filetests make a backend panic when compiled
//!   for another ISA or without a CPU feature), are both an `Err` with the
//!   message.
//! - What is compared is a [`MachineCode`] ([`crate::code`]): bytes,
//!   alignment and relocations with names resolved.
//!
//! # Same machine code
//!
//! [`compare_compiled`] (and its variants [`compare_compiled_renamed`] and
//! [`compare_compiled_code`]) is the one place that decides whether two
//! functions compile to the same machine code, the oracle that does not
//! share the fingerprint's model of "the same":
//!
//! 1. Both are compiled separately, as they are, and compared: bytes,
//!    alignment, and relocations (offset, kind, addend, target), targets
//!    first brought into one namespace by a [`Renaming`] (identity, a
//!    function of the name such as "the name's class", or slot for slot).
//! 2. Block layout order is not part of a fingerprint, and Cranelift's code
//!    can depend on it. So when step 1 finds a difference, both functions
//!    are laid out in one order ([`laid_out_in_walk_order`]: the
//!    fingerprint walk's DFS pre-order, done with Cranelift's own layout
//!    operations, not with the fingerprint's encoder) and compiled again.
//! 3. A difference that remains is a [`CodeMismatch`]: what differs and both
//!    disassemblies (Cranelift's `VCode` text, and the relocations).
//!
//! A compile error of either function is an `Err`, never a mismatch.

use crate::fingerprint::SymbolName;
use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::entity::SecondaryMap;
use cranelift_codegen::ir::{Block, Function, Inst};
use cranelift_codegen::isa::TargetIsa;
use cranelift_codegen::isa::unwind::UnwindInfo;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

pub use crate::code::{MachineCode, RelocTarget, Relocation};

/// What differs between two compilations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeDifference {
    /// The code bytes.
    Bytes,
    /// The relocations (offset, kind, addend or target).
    Relocations,
    /// The alignment the code asks for.
    Alignment,
}

impl fmt::Display for CodeDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CodeDifference::Bytes => "machine code",
            CodeDifference::Relocations => "relocations",
            CodeDifference::Alignment => "alignment",
        })
    }
}

/// What differs between `a` and `b`, if anything (bytes first, then
/// relocations, then alignment). Targets are compared as they are: bring
/// them into one namespace first ([`MachineCode::renamed`]) if they name
/// things differently.
pub fn difference(a: &MachineCode, b: &MachineCode) -> Option<CodeDifference> {
    if a.bytes != b.bytes {
        Some(CodeDifference::Bytes)
    } else if a.relocs != b.relocs {
        Some(CodeDifference::Relocations)
    } else if a.alignment != b.alignment {
        Some(CodeDifference::Alignment)
    } else {
        None
    }
}

/// A function from a relocation to the target it is compared by.
pub type Rename<'a> = Box<dyn Fn(&Relocation) -> RelocTarget + 'a>;

/// How the relocation targets of two compilations are brought into one
/// namespace before they are compared: one function for the first
/// compilation's relocations and one for the second's.
pub struct Renaming<'a> {
    /// Applied to the first compilation's relocations.
    pub first: Rename<'a>,
    /// Applied to the second compilation's relocations.
    pub second: Rename<'a>,
}

impl<'a> Renaming<'a> {
    /// Targets compared as they are: the same code calls the same names.
    pub fn identity() -> Self {
        Self {
            first: Box::new(|r| r.target.clone()),
            second: Box::new(|r| r.target.clone()),
        }
    }

    /// Every name (on both sides) replaced by `class(name)`, other targets
    /// kept: for functions merged over the call graph, whose callees
    /// differ by name but not by class.
    pub fn by_class(class: impl Fn(&Relocation, &SymbolName) -> SymbolName + Clone + 'a) -> Self {
        fn side<'a>(class: impl Fn(&Relocation, &SymbolName) -> SymbolName + 'a) -> Rename<'a> {
            Box::new(move |r| match &r.target {
                RelocTarget::Name(name) => RelocTarget::Name(class(r, name)),
                other => other.clone(),
            })
        }
        Self {
            first: side(class.clone()),
            second: side(class),
        }
    }

    /// Slot for slot: a name in `second_names[i]` on the second side is
    /// compared as `first_names[i]`; the first side and every other target
    /// are kept. For functions with one template (same code, other names):
    /// the second's code must be the first's retargeted to its names, which
    /// is what code reuse hands out. Lists of different lengths rename
    /// nothing (the code then differs in its names).
    pub fn slots(first_names: &'a [SymbolName], second_names: &'a [SymbolName]) -> Self {
        let same_length = first_names.len() == second_names.len();
        Self {
            first: Box::new(|r| r.target.clone()),
            second: Box::new(move |r| match &r.target {
                RelocTarget::Name(name) if same_length => {
                    match second_names.iter().position(|n| n == name) {
                        Some(slot) => RelocTarget::Name(first_names[slot].clone()),
                        None => r.target.clone(),
                    }
                }
                other => other.clone(),
            }),
        }
    }
}

/// Two functions whose machine code differs, also after laying both out in
/// one block order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeMismatch {
    /// What differs (after renaming and laying out).
    pub difference: CodeDifference,
    /// The first function's disassembly (after laying out): Cranelift's
    /// `VCode` text, or the bytes in hex when the backend gives none, then
    /// its relocations as compared (renamed).
    pub first: String,
    /// The second function's disassembly, likewise.
    pub second: String,
}

impl fmt::Display for CodeMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} differs (also with both laid out in one block order)\n\
             --- first ---\n{}\n--- second ---\n{}",
            self.difference, self.first, self.second
        )
    }
}

/// Compares the machine code of `a` and `b` for `isa`, relocation targets
/// as they are (see the [module docs](self)). `Ok(None)`: the same code.
pub fn compare_compiled(
    isa: &dyn TargetIsa,
    a: &Function,
    b: &Function,
) -> Result<Option<CodeMismatch>, String> {
    compare_compiled_renamed(isa, a, b, &Renaming::identity())
}

/// Compares the machine code of `a` and `b` for `isa` with relocation
/// targets brought into one namespace by `renaming` (see the
/// [module docs](self)). `Ok(None)`: the same code.
pub fn compare_compiled_renamed(
    isa: &dyn TargetIsa,
    a: &Function,
    b: &Function,
    renaming: &Renaming,
) -> Result<Option<CodeMismatch>, String> {
    let a_code = compile(a, isa).map_err(|e| format!("compiling the first function: {e}"))?;
    let b_code = compile(b, isa).map_err(|e| format!("compiling the second function: {e}"))?;
    compare_compiled_code(isa, (a, &a_code.code), (b, &b_code.code), renaming)
}

/// [`compare_compiled_renamed`] for functions already compiled as they are
/// (`a.1` is what [`compile`] gave for `a.0`, likewise `b`): compiles
/// again only when that code differs.
pub fn compare_compiled_code(
    isa: &dyn TargetIsa,
    a: (&Function, &MachineCode),
    b: (&Function, &MachineCode),
    renaming: &Renaming,
) -> Result<Option<CodeMismatch>, String> {
    let renamed = |(code, rename): (&MachineCode, &Rename)| code.renamed(rename);
    if difference(
        &renamed((a.1, &renaming.first)),
        &renamed((b.1, &renaming.second)),
    )
    .is_none()
    {
        return Ok(None);
    }
    let laid_out = |func: &Function, rename: &Rename, which: &str| {
        compile_with(&laid_out_in_walk_order(func), isa, true)
            .map(|(c, text)| (c.code.renamed(rename), text))
            .map_err(|e| format!("compiling the {which} function laid out in walk order: {e}"))
    };
    let (a_code, a_text) = laid_out(a.0, &renaming.first, "first")?;
    let (b_code, b_text) = laid_out(b.0, &renaming.second, "second")?;
    Ok(difference(&a_code, &b_code).map(|difference| CodeMismatch {
        difference,
        first: disassembly(&a_code, a_text),
        second: disassembly(&b_code, b_text),
    }))
}

/// `code` as a mismatch shows it: Cranelift's text (or the bytes in hex),
/// the alignment and the relocations.
fn disassembly(code: &MachineCode, text: Option<String>) -> String {
    use std::fmt::Write;
    let mut out = text.unwrap_or_else(|| {
        code.bytes.chunks(16).fold(String::new(), |mut out, line| {
            for byte in line {
                let _ = write!(out, "{byte:02x} ");
            }
            out.push('\n');
            out
        })
    });
    let _ = writeln!(out, "alignment {}", code.alignment);
    for r in &code.relocs {
        let _ = writeln!(
            out,
            "reloc at {:#x}: {} {:?} {:+}",
            r.offset, r.kind, r.target, r.addend
        );
    }
    out
}

/// A copy of `func` with its reachable blocks laid out in the fingerprint
/// walk's order: DFS pre-order from the entry block, following each
/// block's terminator's destinations
/// (`branch_destination(&dfg.jump_tables, &dfg.exception_tables)`) in
/// order. Blocks unreachable from the entry are left out of the layout
/// (with their instructions), as Cranelift's unreachable-code elimination
/// does before lowering. Blocks move with their instructions, in their
/// order; cold blocks stay cold. Done with Cranelift's layout operations
/// only, so the copy is the same function in another block order.
pub fn laid_out_in_walk_order(func: &Function) -> Function {
    let mut func = func.clone();
    let order = walk_order(&func);
    let mut insts: SecondaryMap<Block, Vec<Inst>> = SecondaryMap::new();
    let mut cold: SecondaryMap<Block, bool> = SecondaryMap::new();
    let blocks: Vec<Block> = func.layout.blocks().collect();
    for block in blocks {
        let block_insts: Vec<Inst> = func.layout.block_insts(block).collect();
        for &inst in &block_insts {
            func.layout.remove_inst(inst);
        }
        cold[block] = func.layout.is_cold(block);
        func.layout.remove_block(block);
        insts[block] = block_insts;
    }
    for block in order {
        func.layout.append_block(block);
        if cold[block] {
            func.layout.set_cold(block);
        }
        for &inst in &insts[block] {
            func.layout.append_inst(inst, block);
        }
    }
    func
}

/// The blocks of `func` reachable from its entry, in DFS pre-order
/// following each terminator's destinations in order.
fn walk_order(func: &Function) -> Vec<Block> {
    let dfg = &func.dfg;
    let mut order = Vec::new();
    let mut visited: SecondaryMap<Block, bool> = SecondaryMap::new();
    let mut stack: Vec<Block> = func.layout.entry_block().into_iter().collect();
    while let Some(block) = stack.pop() {
        if std::mem::replace(&mut visited[block], true) {
            continue;
        }
        order.push(block);
        if let Some(last) = func.layout.last_inst(block) {
            let destinations =
                dfg.insts[last].branch_destination(&dfg.jump_tables, &dfg.exception_tables);
            // Pushed in reverse so the first destination is visited next.
            stack.extend(
                destinations
                    .iter()
                    .rev()
                    .map(|call| call.block(&dfg.value_lists))
                    // A destination outside the layout (which the verifier
                    // rejects) is not laid out.
                    .filter(|&b| func.layout.is_block_inserted(b)),
            );
        }
    }
    order
}

/// A compilation and how long it took.
pub struct Compiled {
    /// The result.
    pub code: MachineCode,
    /// Wall time of `Context::compile`.
    pub time: Duration,
    /// The code's unwind information, where the ISA gives one.
    pub unwind: Option<UnwindInfo>,
    /// The bytes of its frame below the frame pointer (spill slots, stack
    /// slots, saved registers, outgoing arguments), as Cranelift laid it
    /// out; 0 where the backend does not say.
    pub frame_bytes: u32,
}

/// Compiles a copy of `func` for `isa` with a default control plane.
pub fn compile(func: &Function, isa: &dyn TargetIsa) -> Result<Compiled, String> {
    compile_with(func, isa, false).map(|(compiled, _)| compiled)
}

/// Compiles a copy of `func` for `isa`, with Cranelift's disassembly
/// (its `VCode` text) when `disasm` is set and the backend gives one.
fn compile_with(
    func: &Function,
    isa: &dyn TargetIsa,
    disasm: bool,
) -> Result<(Compiled, Option<String>), String> {
    let mut ctx = Context::for_function(func.clone());
    ctx.set_disasm(disasm);
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
    let code = MachineCode::of(&ctx)
        .ok_or_else(|| "no compiled code after a successful compile".to_string())?;
    let text = ctx.compiled_code().and_then(|c| c.vcode.clone());
    let unwind = ctx
        .compiled_code()
        .and_then(|c| c.create_unwind_info(isa).ok().flatten());
    let frame_bytes = ctx
        .compiled_code()
        .and_then(|c| c.buffer.frame_layout())
        .map_or(0, |layout| layout.frame_to_fp_offset);
    let compiled = Compiled {
        code,
        time,
        unwind,
        frame_bytes,
    };
    Ok((compiled, text))
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

/// Runs `f` with panics on this thread kept from the panic hook (Cranelift
/// panics that [`compile`] catches would otherwise print a backtrace
/// each); panics on other threads reach it as before.
///
/// The first call wraps the process's hook, once, in one that passes on
/// every panic but those of a thread inside `with_quiet_panics`, so
/// threads never swap hooks under each other. (A hook set later replaces
/// the wrapper: panics are then no longer kept quiet, and nothing else
/// changes.) The wrapper costs a lock the first time only; still, this is
/// for tools, tests and harnesses, not for paths every function takes.
pub fn with_quiet_panics<T>(f: impl FnOnce() -> T) -> T {
    use std::cell::Cell;
    use std::sync::Once;
    thread_local! {
        /// How deep this thread is in `with_quiet_panics`.
        static QUIET: Cell<u32> = const { Cell::new(0) };
    }
    static WRAP_HOOK: Once = Once::new();
    WRAP_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
    QUIET.with(|quiet| quiet.set(quiet.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|quiet| quiet.set(quiet.get() - 1));
    match result {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
