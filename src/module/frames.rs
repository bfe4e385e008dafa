//! Which functions jitfold defined from bytes (reused code, trampolines,
//! code compiled on a batch flush's threads), and how each one's frame is
//! described, for the frame descriptions an object file gets (see
//! `unwind.rs`).
//!
//! # What this module guarantees
//!
//! 1. Every function jitfold defines from bytes is recorded once, in
//!    definition order, with the frame its code has: a template's (reused
//!    code is a byte-for-byte copy), its own unwind information (code
//!    compiled on a thread of a batch flush, see `parallel.rs`), or the
//!    function-entry state (a trampoline is one jump).
//! 2. Whether the inner module compiled a function itself is recorded: an
//!    inner module that writes frame descriptions then wrote one, which is
//!    how `unwind.rs` knows that they were asked for. Parallel flushes
//!    leave the first compile of a module to the inner module (see
//!    `parallel.rs`) so that this holds however the functions are compiled.

// Read only when writing an object file.
#![cfg_attr(not(feature = "object"), allow(dead_code))]

use cranelift_codegen::isa::unwind::UnwindInfo;
use cranelift_module::FuncId;

/// How the frame of a function defined from bytes is described.
#[derive(Clone, Copy, Debug)]
pub(super) enum Frame {
    /// Reused code: the unwind information of the code template with this
    /// index.
    Template(usize),
    /// Code compiled for this function alone: the unwind information with
    /// this index in [`Frames::own`].
    Own(usize),
    /// A trampoline of this many bytes: the function-entry state throughout.
    Entry(u32),
}

/// The functions jitfold defined from bytes, with how their frames are
/// described, in definition order.
#[derive(Default)]
pub(super) struct Frames {
    all: Vec<(FuncId, Frame)>,
    /// The unwind information of [`Frame::Own`] frames.
    own: Vec<UnwindInfo>,
    /// Whether the inner module compiled a function itself.
    inner_compiled: bool,
}

impl Frames {
    /// Records that `id` was defined from bytes framed as `frame`.
    pub(super) fn push(&mut self, id: FuncId, frame: Frame) {
        self.all.push((id, frame));
    }

    /// Records that `id` was defined from bytes compiled for it alone,
    /// whose frame `unwind` describes.
    pub(super) fn push_own(&mut self, id: FuncId, unwind: UnwindInfo) {
        self.all.push((id, Frame::Own(self.own.len())));
        self.own.push(unwind);
    }

    /// Every function recorded, in definition order.
    pub(super) fn all(&self) -> &[(FuncId, Frame)] {
        &self.all
    }

    /// The unwind information of [`Frame::Own`] frames, by index.
    pub(super) fn own(&self) -> &[UnwindInfo] {
        &self.own
    }

    /// Records that the inner module compiled a function itself.
    pub(super) fn note_inner_compiled(&mut self) {
        self.inner_compiled = true;
    }

    /// Whether the inner module compiled a function itself.
    pub(super) fn inner_compiled(&self) -> bool {
        self.inner_compiled
    }
}
