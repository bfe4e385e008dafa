//! Which functions jitfold defined from bytes (reused code, trampolines),
//! and how each one's frame is described, for the frame descriptions an
//! object file gets (see `unwind.rs`).
//!
//! # What this module guarantees
//!
//! Every function jitfold defines from bytes is recorded once, in
//! definition order, with the frame its code has: a template's (reused
//! code is a byte-for-byte copy) or the function-entry state (a
//! trampoline is one jump).

// Read only when writing an object file.
#![cfg_attr(not(feature = "object"), allow(dead_code))]

use cranelift_module::FuncId;

/// How the frame of a function defined from bytes is described.
#[derive(Clone, Copy, Debug)]
pub(super) enum Frame {
    /// Reused code: the unwind information of the code template with this
    /// index.
    Template(usize),
    /// A trampoline of this many bytes: the function-entry state throughout.
    Entry(u32),
}

/// The functions jitfold defined from bytes, with how their frames are
/// described, in definition order.
#[derive(Default)]
pub(super) struct Frames(Vec<(FuncId, Frame)>);

impl Frames {
    /// Records that `id` was defined from bytes framed as `frame`.
    pub(super) fn push(&mut self, id: FuncId, frame: Frame) {
        self.0.push((id, frame));
    }

    /// Every function recorded, in definition order.
    pub(super) fn all(&self) -> &[(FuncId, Frame)] {
        &self.0
    }
}
