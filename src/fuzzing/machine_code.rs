//! The machine-code oracle of the differential check: functions that
//! `DedupModule` merged must compile to the same machine code, judged by
//! [`crate::compile`]'s comparison, which does not share the fingerprint's
//! model of "the same" (the printing and execution oracles can miss a
//! false merge whose difference no input reaches; this one cannot).
//!
//! # What this module guarantees
//!
//! The oracle compiles the functions of a program as they were generated
//! (each separately, callees named `u0:j`), never the ones `DedupModule`
//! rewrote. Then:
//!
//! 1. **Classes by code.** Functions are partitioned by their code (laid
//!    out in the walk's order, so layout does not split them) with
//!    relocations against program functions compared by the callee's class,
//!    refined until stable, as a linker's identical-code folding does:
//!    the coarsest partition in which members have the same code up to
//!    calls between classes. This decides which callees are
//!    interchangeable without trusting `DedupModule`'s own bookkeeping
//!    (its duplicates, call-graph classes and late joins). With distinct
//!    addresses, a name a function uses as data (`func_addr`, symbol
//!    global values) is compared by name, never by class, as
//!    `DedupModule` compares it.
//! 2. **Merged functions.** [`Oracle::check_merged`] compares every function
//!    with the function it was merged into, through
//!    [`compare_compiled_code`] with callee names renamed to their classes:
//!    any difference that remains after laying both out in one order is an
//!    `Err` naming both functions, what differs and both disassemblies.
//! 3. **Reused code.** [`Oracle::check_templates`] compares every function
//!    with the first function of equal template (same code, other names),
//!    the second's names renamed slot for slot to the first's: what code
//!    reuse hands out must be what compiling gives.

use crate::compile::{
    MachineCode, RelocTarget, Relocation, Rename, Renaming, compare_compiled_code, compile,
    laid_out_in_walk_order,
};
use crate::{Fingerprint, Fingerprinter, SymbolName, Template};
use cranelift_codegen::ir::{ExternalName, Function, GlobalValueData, InstructionData};
use cranelift_codegen::ir::{UserExternalName, UserExternalNameRef};
use cranelift_codegen::isa::TargetIsa;
use std::collections::HashSet;

/// The namespace of the names that stand for classes of program functions
/// in compared relocations (program functions are in namespace 0).
pub const CLASS_NAMESPACE: u32 = u32::MAX;

/// The machine-code oracle for one program's functions (see the module
/// docs). Compiles each function at most twice (as it is, and laid out in
/// the walk's order), whatever is asked.
pub struct Oracle<'a> {
    isa: &'a dyn TargetIsa,
    funcs: &'a [Function],
    as_is: Vec<Option<MachineCode>>,
    laid_out: Vec<Option<MachineCode>>,
    data_names: Vec<HashSet<SymbolName>>,
    /// Classes by code: `[names used as data by name, by class]`.
    classes: [Option<Vec<u32>>; 2],
    /// Pairs (first, second, data names by class) already compared.
    compared: HashSet<(usize, usize, bool)>,
}

impl<'a> Oracle<'a> {
    /// An oracle for `funcs` (function `j` is the user name `u0:j`),
    /// compiled for `isa`.
    pub fn new(isa: &'a dyn TargetIsa, funcs: &'a [Function]) -> Self {
        Self {
            isa,
            funcs,
            as_is: vec![None; funcs.len()],
            laid_out: vec![None; funcs.len()],
            data_names: funcs.iter().map(names_used_as_data).collect(),
            classes: [None, None],
            compared: HashSet::new(),
        }
    }

    /// Pairs of functions compared so far.
    pub fn compared(&self) -> usize {
        self.compared.len()
    }

    fn code(&mut self, i: usize, laid_out: bool) -> Result<MachineCode, String> {
        let (cache, func) = if laid_out {
            (&mut self.laid_out, laid_out_in_walk_order(&self.funcs[i]))
        } else {
            (&mut self.as_is, self.funcs[i].clone())
        };
        if cache[i].is_none() {
            let code = compile(&func, self.isa)
                .map_err(|e| format!("machine-code oracle: compiling f{i}: {e}"))?
                .code;
            cache[i] = Some(code);
        }
        Ok(cache[i].clone().expect("just filled"))
    }

    /// How function `side`'s relocations are compared under `classes`:
    /// program functions by class, except names `side` uses as data when
    /// those are compared by name.
    fn rename<'c>(&'c self, side: usize, classes: &'c [u32], data_by_class: bool) -> Rename<'c> {
        let data = &self.data_names[side];
        Box::new(move |r: &Relocation| match &r.target {
            RelocTarget::Name(name @ SymbolName::User(u))
                if u.namespace == 0
                    && (u.index as usize) < classes.len()
                    && (data_by_class || !data.contains(name)) =>
            {
                RelocTarget::Name(SymbolName::User(UserExternalName::new(
                    CLASS_NAMESPACE,
                    classes[u.index as usize],
                )))
            }
            other => other.clone(),
        })
    }

    /// The classes by code (guarantee 1), names used as data compared by
    /// class when `data_by_class`.
    fn classes(&mut self, data_by_class: bool) -> Result<Vec<u32>, String> {
        if let Some(classes) = &self.classes[usize::from(data_by_class)] {
            return Ok(classes.clone());
        }
        let n = self.funcs.len();
        let codes = (0..n)
            .map(|i| self.code(i, true))
            .collect::<Result<Vec<_>, _>>()?;
        let mut classes = vec![0u32; n];
        let mut count = 1;
        loop {
            let keys: Vec<MachineCode> = (0..n)
                .map(|i| codes[i].renamed(&self.rename(i, &classes, data_by_class)))
                .collect();
            let mut next = vec![0u32; n];
            let mut firsts: Vec<usize> = Vec::new();
            for i in 0..n {
                let same = firsts
                    .iter()
                    .position(|&f| classes[f] == classes[i] && keys[f] == keys[i]);
                next[i] = match same {
                    Some(class) => class as u32,
                    None => {
                        firsts.push(i);
                        firsts.len() as u32 - 1
                    }
                };
            }
            classes = next;
            // Classes only split; the same number means nothing split.
            if firsts.len() == count {
                break;
            }
            count = firsts.len();
        }
        self.classes[usize::from(data_by_class)] = Some(classes.clone());
        Ok(classes)
    }

    /// Checks guarantee 2 for `merged`, pairs `(function, the function it
    /// was merged into)`; `distinct_addresses` as the merging module had
    /// it. `what` says which module merged them, for the message.
    pub fn check_merged(
        &mut self,
        merged: &[(usize, usize)],
        distinct_addresses: bool,
        what: &str,
    ) -> Result<(), String> {
        let data_by_class = !distinct_addresses;
        for &(member, into) in merged {
            if !self.compared.insert((into, member, data_by_class)) {
                continue;
            }
            let classes = self.classes(data_by_class)?;
            let (a, b) = (self.code(into, false)?, self.code(member, false)?);
            let renaming = Renaming {
                first: self.rename(into, &classes, data_by_class),
                second: self.rename(member, &classes, data_by_class),
            };
            let claim = format!("{what} merged f{member} into f{into}");
            self.same_code((into, &a), (member, &b), &renaming, &claim)?;
        }
        Ok(())
    }

    /// Compares the code `a.1` of function `a.0` with the code `b.1` of
    /// function `b.0` (relocation targets brought together by `renaming`);
    /// a mismatch is an error that says `claim` (why they should be the
    /// same) and shows both functions.
    fn same_code(
        &self,
        a: (usize, &MachineCode),
        b: (usize, &MachineCode),
        renaming: &Renaming,
        claim: &str,
    ) -> Result<(), String> {
        let (first, second) = (a.0, b.0);
        let mismatch = compare_compiled_code(
            self.isa,
            (&self.funcs[first], a.1),
            (&self.funcs[second], b.1),
            renaming,
        )
        .map_err(|e| format!("machine-code oracle: f{first} and f{second}: {e}"))?;
        match mismatch {
            None => Ok(()),
            Some(mismatch) => Err(format!(
                "machine-code oracle: {claim}, but their {mismatch}\n{}\n{}",
                self.funcs[first].display(),
                self.funcs[second].display()
            )),
        }
    }

    /// Checks guarantee 3: every function against the first function with
    /// its template, when their names differ.
    pub fn check_templates(&mut self) -> Result<(), String> {
        let mut fingerprinter = Fingerprinter::new();
        let mut firsts: Vec<(Fingerprint, usize, Template, Vec<SymbolName>)> = Vec::new();
        for i in 0..self.funcs.len() {
            let walk = fingerprinter.walk(&self.funcs[i]);
            let (fp, template) = (walk.fingerprint(), walk.template());
            let names = walk.names().to_vec();
            let Some((first_fp, first, _, first_names)) =
                firsts.iter().find(|(_, _, t, _)| *t == template)
            else {
                firsts.push((fp, i, template, names));
                continue;
            };
            if *first_fp == fp || !self.compared.insert((*first, i, false)) {
                continue;
            }
            let first = *first;
            let (a, b) = (self.code(first, false)?, self.code(i, false)?);
            let renaming = Renaming::slots(first_names, &names);
            let claim = format!("f{i} has f{first}'s template (its code would be reused)");
            self.same_code((first, &a), (i, &b), &renaming, &claim)?;
        }
        Ok(())
    }
}

/// The names `func` uses as data: by `func_addr` in its layout, or in a
/// symbol global value.
fn names_used_as_data(func: &Function) -> HashSet<SymbolName> {
    let resolve = |name: &ExternalName| match name {
        ExternalName::User(r) => Some(user_name(func, *r)),
        ExternalName::TestCase(t) => Some(SymbolName::TestCase(t.raw().into())),
        ExternalName::LibCall(_) | ExternalName::KnownSymbol(_) => None,
    };
    let mut names = HashSet::new();
    for block in func.layout.blocks() {
        for inst in func.layout.block_insts(block) {
            if let InstructionData::FuncAddr { func_ref, .. } = func.dfg.insts[inst]
                && let Some(data) = func.dfg.ext_funcs.get(func_ref)
            {
                names.extend(resolve(&data.name));
            }
        }
    }
    for (_, gv) in func.global_values.iter() {
        if let GlobalValueData::Symbol { name, .. } = gv {
            names.extend(resolve(name));
        }
    }
    names
}

fn user_name(func: &Function, r: UserExternalNameRef) -> SymbolName {
    SymbolName::User(func.params.user_named_funcs()[r].clone())
}
