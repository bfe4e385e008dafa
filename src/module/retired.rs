//! Classes whose compiled code no later function may run.
//!
//! A JIT finalize binds a call of a function the module has declared
//! preemptible but not defined to the host's symbol of that name
//! (cranelift-jit 0.135.8, `JITModule::get_address`: a name that is not a
//! defined local is looked up among the host's symbols). Defined later, the
//! same function binds the calls of everything finalized after it to the
//! module's definition. So a function finalized while such a callee was
//! bound to the host is no longer what an equal function defined later
//! computes: plain `JITModule` would bind the later one's call to the
//! module's definition, if it is defined by then.
//!
//! # What this module guarantees
//!
//! 1. Each class records the functions and data objects of the module its
//!    first function's code names (calls and addresses: its relocations),
//!    when the class starts.
//! 2. At a JIT finalize, a class started since the last one whose code
//!    names a preemptible function or data object the module does not
//!    define (so bound to the host's symbol, which a later definition
//!    replaces for what is finalized after it) is
//!    *retired* (`jit.rs`): no later function becomes its duplicate, an
//!    adapter calling it or a thunk of it (eager similar merging), and no
//!    call is redirected by a late merge (`join.rs`) to or from a function
//!    running retired code. So is every class naming an import (or an
//!    imported data object) that a declaration makes definable
//!    (`forward.rs`): the JIT bound it to the host's symbol too. Its
//!    template stays: reused code has its relocations retargeted and bound
//!    at its own finalize, so it binds as plain Cranelift does.
//! 3. The next function of a retired class that is compiled becomes the
//!    class's canonical function, and the class is no longer retired (its
//!    code is bound at its own finalize, and retired again then if the
//!    callee is still not defined); the old code stays marked, so no call
//!    is ever redirected to or from it.

use crate::cache::ClassId;
use crate::fingerprint::SymbolName;
use cranelift_codegen::entity::SecondaryMap;
use cranelift_module::{DataId, FuncId};

/// What each class's code names, and which classes are retired.
#[derive(Default)]
pub(super) struct Retired {
    /// The functions and data objects of the module each class's code
    /// names (see 1 above).
    names: SecondaryMap<ClassId, Vec<Named>>,
    retired: SecondaryMap<ClassId, bool>,
    /// The functions whose code was retired (their class's canonical
    /// function when it was), for good: a class taken over by a new
    /// member is no longer retired, but the old code is as it was.
    bound: SecondaryMap<FuncId, bool>,
}

/// A function or data object of the module that code names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Named {
    Function(FuncId),
    Data(DataId),
}

impl Retired {
    /// Notes that `class` starts with code naming `names` (see 1 above);
    /// a retired class is no longer retired (see 3 above).
    pub(super) fn start(&mut self, class: ClassId, names: &[SymbolName]) {
        self.names[class] = names
            .iter()
            .filter_map(|name| match name {
                SymbolName::User(u) if u.namespace == 0 => {
                    Some(Named::Function(FuncId::from_u32(u.index)))
                }
                SymbolName::User(u) if u.namespace == 1 => {
                    Some(Named::Data(DataId::from_u32(u.index)))
                }
                _ => None,
            })
            .collect();
        self.retired[class] = false;
    }

    /// The functions and data objects the code of `class` names (read by
    /// the JIT's finalize alone).
    #[cfg_attr(not(feature = "jit"), allow(dead_code))]
    pub(super) fn names(&self, class: ClassId) -> &[Named] {
        &self.names[class]
    }

    /// Retires `class`, whose code is `canonical`'s (see 2 above).
    pub(super) fn retire(&mut self, class: ClassId, canonical: FuncId) {
        self.retired[class] = true;
        self.bound[canonical] = true;
    }

    /// Whether `id` runs code that was retired (see 2 above).
    pub(super) fn runs_retired(&self, id: FuncId) -> bool {
        self.bound[id]
    }

    /// The classes whose code names `named`, not retired yet.
    pub(super) fn naming(&self, named: Named) -> Vec<ClassId> {
        self.names
            .iter()
            .filter(|(class, names)| !self.retired[*class] && names.contains(&named))
            .map(|(class, _)| class)
            .collect()
    }

    /// Whether `class` is retired.
    pub(super) fn is_retired(&self, class: ClassId) -> bool {
        self.retired[class]
    }
}
