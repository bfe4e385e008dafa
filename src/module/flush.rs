//! A batch flush as a value: one [`Record`] per function recorded since
//! the last flush, holding everything the flush knows about it.
//!
//! What an *id* is (pending, planned as a duplicate, defined) is its
//! `State` (`ids.rs`), since references to it are resolved by that state.
//! What a *record* is to its flush, beyond that, is its [`Role`], and the
//! rest of what the flush keeps about it (its walk, the function as the
//! user wrote it, code compiled and the store's entry checked for it on
//! another thread) is in the record:
//! no container is indexed by position beside the records, and nothing of
//! a flush outlives it.
//!
//! # What this module guarantees
//!
//! 1. A record's role changes only through the methods below, which are
//!    its transitions (no other code assigns a role):
//!
//!    | from | to | method | when |
//!    |---|---|---|---|
//!    | (recorded) | open | [`Record::new`] | batch mode records it |
//!    | (recorded) | kept | [`Record::kept`] | eager mode left it to the flush (8 in `stored.rs`) |
//!    | open | as written | [`Record::put_back_as_written`] | it is a root planning rewrote (see `roots.rs`) |
//!    | open, as written, kept | alone | [`Record::leave_alone`] | the root of its plan failed, or planning panicked |
//!
//!    Every move is one way: a flush's rounds only ever take functions
//!    out of planning, which bounds them (see `batch.rs`). A root put back
//!    and later left alone (it was planned as a duplicate of a root that
//!    failed) is a root no more: it may be rewritten again, and is defined
//!    after every root and duplicate (see `roots.rs`); so may a kept
//!    function left alone.
//! 2. A record's walk is of its function as it is: every method that
//!    changes the function ([`Record::rewritten`], [`Record::undo`],
//!    [`Record::put_back_as_written`], [`Record::replace`]) drops the
//!    walk, the entry checked and the store key kept for the function,
//!    and drops code compiled for the function before (returned, for the
//!    statistics). A rewrite of the function in place (its references to
//!    duplicates, `roots.rs`) ends with [`Record::rewritten`]; during
//!    planning, the walk it held (taken out first) is then put back
//!    renamed where renaming gives the rewritten function's walk
//!    (`renamed_walk` in `address.rs`); its definition takes all four out
//!    first, and drops them if it rewrites (`batch.rs`).
//! 3. [`Record::original`] is the function as the user defined it, kept
//!    from the first rewrite the flush makes until the flush ends or puts
//!    it back.

use super::parallel::Precompiled;
use super::stored::{CheckedEntry, KnownKey};
use crate::plan::Walk;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::Function;
use cranelift_module::FuncId;

/// What a recorded function is to its flush, beyond its id's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Role {
    /// Planned by every planning of the flush: as a duplicate, as what
    /// duplicates run, or as its own plan says.
    #[default]
    Open,
    /// A root of the plan that planning rewrote, put back as the user
    /// wrote it: rewritten no more until the plan's duplicates are
    /// defined (see `roots.rs`). Still planned.
    AsWritten,
    /// An eager definition left to the flush, since another module was
    /// compiling its template (8 in `stored.rs`): kept as eager mode
    /// walked it, never rewritten (neither by planning nor when it is
    /// defined), so that its template stays the one that module is
    /// compiling, whose entry the flush loads instead of compiling
    /// another template for it. Its calls of duplicates defined since go
    /// through their trampolines (a thunk of a similar body made for it
    /// instead names them as any eager define does, see `similar.rs`);
    /// the functions whose addresses it uses as data were noted when it
    /// was left (see 2 in `address.rs`), so no duplicate defined since
    /// shares an address it uses. Still planned.
    Kept,
    /// Planned as nothing for the rest of the flush (the root of its plan
    /// failed, or planning panicked): defined on its own.
    Alone,
}

/// What a flush made for a function ahead of its turn, each used only if
/// the function is still what it was made for: its code, compiled on
/// another thread (`parallel.rs`; left here when it is not used, for the
/// caller to count as discarded), the code store's entry for it, checked
/// on another thread, and its template's store key, computed when its
/// entry was asked for (`stored.rs`).
#[derive(Default)]
pub(super) struct Ahead {
    pub(super) code: Option<Precompiled>,
    pub(super) entry: Option<CheckedEntry>,
    pub(super) key: Option<KnownKey>,
}

/// One function recorded for a flush.
pub(super) struct Record {
    /// Its id.
    pub(super) id: FuncId,
    /// The function, as the flush has rewritten it so far.
    pub(super) func: Function,
    /// The control plane it was defined with.
    pub(super) control: ControlPlane,
    /// Its walk, if walked since it last changed (see 2 above).
    pub(super) walk: Option<Walk>,
    /// Code compiled for it on another thread (see `parallel.rs`).
    pub(super) code: Option<Precompiled>,
    /// The store's entry for it, checked on another thread, with the
    /// checks of the function that loading it needs (see `stored.rs`).
    pub(super) entry: Option<CheckedEntry>,
    /// Its template's store key, computed when its entry was asked for
    /// (see `stored.rs`).
    pub(super) key: Option<KnownKey>,
    /// The function as the user wrote it, once the flush rewrote it (see
    /// 3 above). Boxed: few records keep one, and every record moves as
    /// the flush's list grows.
    original: Option<Box<Function>>,
    /// Its role (see 1 above).
    role: Role,
}

impl Record {
    /// A function recorded for the next flush.
    pub(super) fn new(id: FuncId, func: Function, control: ControlPlane) -> Self {
        Self {
            id,
            func,
            control,
            walk: None,
            code: None,
            entry: None,
            key: None,
            original: None,
            role: Role::Open,
        }
    }

    /// A definition eager mode left to the flush, walked as `walk` (see
    /// [`Role::Kept`]).
    pub(super) fn kept(id: FuncId, func: Function, control: ControlPlane, walk: Walk) -> Self {
        Self {
            walk: Some(walk),
            role: Role::Kept,
            ..Self::new(id, func, control)
        }
    }

    /// Its role in the flush.
    pub(super) fn role(&self) -> Role {
        self.role
    }

    /// Whether planning may rewrite its references to planned duplicates:
    /// not a root put back as the user wrote it, nor a function kept as
    /// eager mode walked it.
    pub(super) fn rewritten_by_planning(&self) -> bool {
        matches!(self.role, Role::Open | Role::Alone)
    }

    /// Whether its definition may rewrite its references to duplicates
    /// defined or planned since: not for a function kept as eager mode
    /// walked it.
    pub(super) fn rewritten_when_defined(&self) -> bool {
        self.role != Role::Kept
    }

    /// Whether the flush rewrote it, or put it back as the user wrote it:
    /// such a function counts on the plan, or names planned duplicates.
    pub(super) fn rewritten_in_flush(&self) -> bool {
        self.original.is_some() || self.role != Role::Open
    }

    /// The function as the user wrote it, if the flush rewrote it.
    pub(super) fn original(&self) -> Option<&Function> {
        self.original.as_deref()
    }

    /// Notes that the function is about to be rewritten: keeps it as the
    /// user wrote it, the first time.
    pub(super) fn keep_original(&mut self) {
        if self.original.is_none() {
            self.original = Some(Box::new(self.func.clone()));
        }
    }

    /// Notes that the function was changed in place: its walk, its
    /// checked entry and any code compiled for it are of the function as
    /// it was (see 2 above).
    pub(super) fn rewritten(&mut self) -> Option<Precompiled> {
        self.walk = None;
        self.entry = None;
        self.key = None;
        self.code.take()
    }

    /// Replaces the function with `func` (a thunk, see `similar.rs`).
    pub(super) fn replace(&mut self, func: Function) -> Option<Precompiled> {
        self.func = func;
        self.rewritten()
    }

    /// Puts a root back as the user wrote it, for the rest of the flush
    /// (see 1 above); nothing if the flush never rewrote it. Returns code
    /// compiled for the rewritten function, if any.
    pub(super) fn put_back_as_written(&mut self) -> Option<Precompiled> {
        let original = self.original.take()?;
        self.func = *original;
        if self.role == Role::Open {
            self.role = Role::AsWritten;
        }
        self.rewritten()
    }

    /// Plans it as nothing for the rest of the flush (see 1 above).
    pub(super) fn leave_alone(&mut self) {
        self.role = Role::Alone;
    }

    /// Undoes the flush's rewrites of it: it is as the user wrote it
    /// again, and may be rewritten again (its role stays). Returns code
    /// compiled for it, which was compiled counting on the plan.
    pub(super) fn undo(&mut self) -> Option<Precompiled> {
        if let Some(original) = self.original.take() {
            self.func = *original;
            self.walk = None;
            self.entry = None;
            self.key = None;
        }
        self.code.take()
    }

    /// Takes the function out, for its definition.
    pub(super) fn take_func(&mut self) -> Function {
        std::mem::replace(&mut self.func, Function::new())
    }
}

#[cfg(test)]
mod tests {
    use super::{Record, Role};
    use cranelift_codegen::control::ControlPlane;
    use cranelift_codegen::ir::{Function, UserFuncName};
    use cranelift_module::FuncId;

    fn named(index: u32) -> Function {
        let mut func = Function::new();
        func.name = UserFuncName::user(0, index);
        func
    }

    fn record() -> Record {
        Record::new(FuncId::from_u32(0), named(1), ControlPlane::default())
    }

    #[test]
    fn a_root_put_back_is_as_written_and_stays_so() {
        let mut r = record();
        // Never rewritten: nothing to put back, still open.
        assert!(r.put_back_as_written().is_none());
        assert_eq!(r.role(), Role::Open);
        assert!(!r.rewritten_in_flush());
        r.keep_original();
        r.func = named(2);
        r.keep_original();
        assert!(r.rewritten_in_flush());
        r.put_back_as_written();
        assert_eq!(r.func.name, UserFuncName::user(0, 1));
        assert_eq!(r.role(), Role::AsWritten);
        assert!(r.rewritten_in_flush());
        // Undoing keeps the role: a put-back root is never rewritten again.
        r.undo();
        assert_eq!(r.role(), Role::AsWritten);
    }

    #[test]
    fn a_kept_function_is_never_rewritten_until_left_alone() {
        let func = named(1);
        let walk = crate::plan::Walk::of(&mut crate::Fingerprinter::new(), &func);
        let mut r = Record::kept(FuncId::from_u32(0), func, ControlPlane::default(), walk);
        assert_eq!(r.role(), Role::Kept);
        assert!(r.walk.is_some());
        assert!(!r.rewritten_by_planning() && !r.rewritten_when_defined());
        // Named planned duplicates, maybe: not a member of a merged body.
        assert!(r.rewritten_in_flush());
        // Nothing to put back; undoing keeps the role.
        assert!(r.put_back_as_written().is_none());
        r.undo();
        assert_eq!(r.role(), Role::Kept);
        r.leave_alone();
        assert!(r.rewritten_by_planning() && r.rewritten_when_defined());
    }

    #[test]
    fn alone_is_final() {
        let mut r = record();
        r.leave_alone();
        r.keep_original();
        r.func = named(2);
        r.put_back_as_written();
        assert_eq!(r.role(), Role::Alone);
    }

    #[test]
    fn undo_gives_the_user_function_back_and_forgets_the_walk() {
        let mut r = record();
        r.keep_original();
        r.func = named(7);
        r.walk = Some(crate::plan::Walk::of(
            &mut crate::Fingerprinter::new(),
            &r.func,
        ));
        r.undo();
        assert_eq!(r.func.name, UserFuncName::user(0, 1));
        assert!(r.walk.is_none());
        assert!(r.original().is_none());
        assert_eq!(r.role(), Role::Open);
    }
}
