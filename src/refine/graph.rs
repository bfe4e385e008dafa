//! [`CallGraph`]: functions, their name slots and their own names, resolved
//! into [`Node`]s for [`refine`].
//!
//! # What this module guarantees
//!
//! - A slot refers to a node ([`Target::Function`]) exactly when its name is
//!   the own name of functions of that one node and the function does not
//!   take its address; every other slot is [`Target::Outside`], with an
//!   [`OutsideId`] such that equal names get equal ids and different names
//!   different ones.
//! - Names are compared by value, in full (never by hash alone); they are
//!   stored once each, in one buffer.

use super::{
    Node, NodeId, OutsideId, Quotient, Refinement, Target, TemplateId, refine, refine_identifying,
};
use crate::fingerprint::{Fingerprint, Fingerprinter, SymbolName, Template};
use core::hash::BuildHasher;
use cranelift_codegen::entity::{EntityRef, PrimaryMap};
use cranelift_codegen::ir::UserFuncName;
use cranelift_codegen::ir::{ExternalName, Function, UserExternalName};
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A set of functions to refine, built from what the
/// [`Fingerprinter`](crate::Fingerprinter) found. Nodes are classes of
/// functions known to be equal already (e.g. exact duplicates, which share
/// template and names), and every function's own name points at its node.
/// Names are resolved when [`CallGraph::refine`] runs:
///
/// - a name that only functions of one node have refers to that node,
///   unless the referring function takes its address (then its identity
///   matters, and it stays an outside name);
/// - any other name (imports, data symbols, a name of functions in two
///   nodes) is an outside name, compared by value.
#[derive(Default)]
pub struct CallGraph {
    /// The names in slots, numbered (the number is the name's
    /// [`OutsideId`] if the slot is outside).
    names: Interner,
    nodes: PrimaryMap<NodeId, NodeEntry>,
    templates: Vec<Template>,
    /// All nodes' slots (name numbers, address taken), one after another.
    slots: Vec<(OutsideId, bool)>,
    /// Functions' own names, resolved against slot names by `refine` (a
    /// name no slot has needs no number): the name and its node.
    own_names: Vec<(Stored, NodeId)>,
    own_bytes: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Nobody,
    Node(NodeId),
    Several,
}

/// A node: its slots are `slots[start..end]`; its template is
/// `templates[template]`, kept only for nodes with a slot that may be a
/// call (the others can never refer to a node), else `NO_TEMPLATE`.
#[derive(Clone, Copy)]
struct NodeEntry {
    template: u32,
    start: u32,
    end: u32,
    /// The number of instructions its walk encoded.
    instructions: u32,
}

const NO_TEMPLATE: u32 = u32::MAX;

/// A name, borrowed.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum NameRef<'a> {
    User(u32, u32),
    TestCase(&'a [u8]),
}

impl<'a> From<&'a SymbolName> for NameRef<'a> {
    fn from(name: &'a SymbolName) -> Self {
        match name {
            SymbolName::User(user) => NameRef::User(user.namespace, user.index),
            SymbolName::TestCase(bytes) => NameRef::TestCase(bytes),
        }
    }
}

/// Names numbered in order of first sight; test-case bytes in one buffer.
#[derive(Default)]
struct Interner {
    table: HashTable<OutsideId>,
    stored: PrimaryMap<OutsideId, Stored>,
    bytes: Vec<u8>,
    hasher: DefaultHashBuilder,
}

#[derive(Clone, Copy)]
enum Stored {
    User(u32, u32),
    /// Start and length in `bytes`.
    TestCase(u32, u32),
}

impl Interner {
    fn get(&self, number: OutsideId) -> NameRef<'_> {
        match self.stored[number] {
            Stored::User(namespace, index) => NameRef::User(namespace, index),
            Stored::TestCase(start, len) => {
                NameRef::TestCase(&self.bytes[start as usize..][..len as usize])
            }
        }
    }

    /// The number of `name`, if it has one.
    fn find(&self, name: NameRef<'_>) -> Option<OutsideId> {
        let hash = self.hasher.hash_one(name);
        self.table.find(hash, |&n| self.get(n) == name).copied()
    }

    /// The number of `name`, giving it the next one if it is new.
    fn number(&mut self, name: NameRef<'_>) -> OutsideId {
        let hash = self.hasher.hash_one(name);
        if let Some(&n) = self.table.find(hash, |&n| self.get(n) == name) {
            return n;
        }
        let n = self.stored.push(match name {
            NameRef::User(namespace, index) => Stored::User(namespace, index),
            NameRef::TestCase(bytes) => {
                let start = self.bytes.len() as u32;
                self.bytes.extend_from_slice(bytes);
                Stored::TestCase(start, bytes.len() as u32)
            }
        });
        // The table is moved out while it grows, so that rehashing can
        // read the stored names.
        let mut table = core::mem::take(&mut self.table);
        let this = &*self;
        table.insert_unique(hash, n, |&n| this.hasher.hash_one(this.get(n)));
        self.table = table;
        n
    }
}

impl CallGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty graph with room for about `functions` functions and nodes.
    pub fn with_capacity(functions: usize) -> Self {
        Self {
            nodes: PrimaryMap::with_capacity(functions),
            slots: Vec::with_capacity(functions * 2),
            own_names: Vec::with_capacity(functions),
            own_bytes: Vec::with_capacity(functions * 16),
            ..Self::default()
        }
    }

    /// Adds a node: functions with this fingerprint (exact or, as
    /// [`Fingerprint::to_template`] makes it, a template; only the template is
    /// used), slot names and address-taken flags (see
    /// [`crate::Walk::names`] and [`crate::Walk::address_taken`]). Returns its
    /// id; nodes are numbered from 0 in the order added.
    ///
    /// Add one node per exact class (functions with equal fingerprints): two
    /// nodes with equal keys that do not call nodes are not compared, so
    /// their callers could only merge once the caller merged them itself.
    /// (That costs merges, never correctness.)
    pub fn add_node(
        &mut self,
        fingerprint: &Fingerprint,
        names: &[SymbolName],
        address_taken: &[bool],
    ) -> NodeId {
        let template = if address_taken.iter().any(|&taken| !taken) {
            self.templates.push(fingerprint.to_template());
            self.templates.len() as u32 - 1
        } else {
            NO_TEMPLATE
        };
        let start = self.slots.len() as u32;
        for (name, &taken) in names.iter().zip(address_taken) {
            let number = self.names.number(name.into());
            self.slots.push((number, taken));
        }
        self.nodes.push(NodeEntry {
            template,
            start,
            end: self.slots.len() as u32,
            instructions: fingerprint.instructions(),
        })
    }

    /// Records that a function named `name` belongs to `node`.
    pub fn add_function(&mut self, name: &SymbolName, node: NodeId) {
        self.add_owner(name.into(), node);
    }

    /// Records that a function whose `ir::Function::name` is `name` belongs
    /// to `node`.
    pub fn add_function_with_func_name(&mut self, name: &UserFuncName, node: NodeId) {
        let name = match name {
            UserFuncName::User(user) => NameRef::User(user.namespace, user.index),
            UserFuncName::Testcase(name) => NameRef::TestCase(name.raw()),
        };
        self.add_owner(name, node);
    }

    fn add_owner(&mut self, name: NameRef<'_>, node: NodeId) {
        let stored = match name {
            NameRef::User(namespace, index) => Stored::User(namespace, index),
            NameRef::TestCase(bytes) => {
                let start = self.own_bytes.len() as u32;
                self.own_bytes.extend_from_slice(bytes);
                Stored::TestCase(start, bytes.len() as u32)
            }
        };
        self.own_names.push((stored, node));
    }

    /// Which node owns each slot name.
    fn owners(&self) -> PrimaryMap<OutsideId, Owner> {
        let mut owners = PrimaryMap::from(vec![Owner::Nobody; self.names.stored.len()]);
        for &(stored, node) in &self.own_names {
            let name = match stored {
                Stored::User(namespace, index) => NameRef::User(namespace, index),
                Stored::TestCase(start, len) => {
                    NameRef::TestCase(&self.own_bytes[start as usize..][..len as usize])
                }
            };
            let Some(number) = self.names.find(name) else {
                continue;
            };
            let owner = &mut owners[number];
            *owner = match *owner {
                Owner::Nobody => Owner::Node(node),
                Owner::Node(n) if n == node => Owner::Node(n),
                Owner::Node(_) | Owner::Several => Owner::Several,
            };
        }
        owners
    }

    /// Number of nodes added.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Resolves the names and refines the nodes; classes are numbered as in
    /// [`refine`], nodes as returned by [`CallGraph::add_node`]. Each node
    /// is compared as it is: one that calls two nodes found equal is not
    /// compared with one that calls either twice (see
    /// [`CallGraph::refine_with`]).
    pub fn refine(&self) -> Refinement {
        self.refine_nodes(None::<fn(NodeId) -> Option<&'static Function>>)
    }

    /// [`CallGraph::refine`], with callees of one class counted as one
    /// callee ([`refine_identifying`]): `function(node)` is a function of
    /// `node`, one whose walk gave [`CallGraph::add_node`] its fingerprint
    /// and names (or `None`, which compares the node as it is). Where a
    /// node calls two functions of one class, its function is walked again
    /// with the second's name renamed to the first's, and compared as
    /// that: a function that calls `g0` and then its twin `g1` merges with
    /// one that calls `g0` twice, and mutually recursive functions that
    /// call both twins of a cycle merge with those that call one.
    pub fn refine_with<'f>(
        &self,
        function: impl FnMut(NodeId) -> Option<&'f Function>,
    ) -> Refinement {
        self.refine_nodes(Some(function))
    }

    /// [`CallGraph::refine_with`] given `function`, else
    /// [`CallGraph::refine`].
    fn refine_nodes<'f>(
        &self,
        function: Option<impl FnMut(NodeId) -> Option<&'f Function>>,
    ) -> Refinement {
        let owners = self.owners();
        let mut targets = Vec::with_capacity(self.slots.len());
        let mut ranges = Vec::with_capacity(self.nodes.len());
        // Only a node with a slot that refers to a node can merge beyond
        // exact duplicates (its other slots are names, which the exact key
        // has already), and only with nodes that have one: templates are
        // compared among those nodes alone.
        let mut templates: HashMap<&Template, TemplateId> = HashMap::new();
        let mut template_of = Vec::with_capacity(self.nodes.len());
        for n in self.nodes.values() {
            let start = targets.len();
            let slots = &self.slots[n.start as usize..n.end as usize];
            targets.extend(slots.iter().map(|&(name, taken)| match owners[name] {
                Owner::Node(node) if !taken => Target::Function(node),
                _ => Target::Outside(name),
            }));
            let calls_nodes = targets[start..]
                .iter()
                .any(|t| matches!(t, Target::Function(_)));
            let template = (calls_nodes && n.template != NO_TEMPLATE)
                .then(|| &self.templates[n.template as usize]);
            template_of.push(template.map(|t| {
                let next = TemplateId::new(templates.len());
                *templates.entry(t).or_insert(next)
            }));
            ranges.push(start..targets.len());
        }
        // The others each get a template number of their own.
        let mut unique = templates.len();
        let nodes: Vec<Node<'_>> = template_of
            .into_iter()
            .zip(ranges)
            .map(|(template, range)| Node {
                template: template.unwrap_or_else(|| {
                    unique += 1;
                    TemplateId::new(unique - 1)
                }),
                slots: &targets[range],
            })
            .collect();
        let Some(mut function) = function else {
            return refine(&nodes);
        };
        // Nodes that call nodes start by their number of instructions,
        // which renaming callees does not change; the others alone.
        let start: Vec<u32> = nodes
            .iter()
            .zip(self.nodes.values())
            .map(|(node, entry)| {
                if node.template.index() < templates.len() {
                    entry.instructions
                } else {
                    ALONE | node.template.as_u32()
                }
            })
            .collect();
        // Templates of functions walked again, numbered after the others.
        let mut walked: HashMap<Template, TemplateId> = HashMap::new();
        let mut walker: Option<Fingerprinter> = None;
        refine_identifying(&nodes, start.into_iter(), |node, same| {
            let entry = self.nodes[node];
            let slots = &self.slots[entry.start as usize..entry.end as usize];
            // Each slot by its name's number.
            let slot_of: HashMap<OutsideId, usize> = slots
                .iter()
                .enumerate()
                .map(|(s, &(n, _))| (n, s))
                .collect();
            let func = self.renamed(function(node)?, slots, &slot_of, same)?;
            let walker = walker.get_or_insert_with(Fingerprinter::new);
            // (A walk that panics compares the node as it is.)
            let (template, names) = catch_unwind(AssertUnwindSafe(|| {
                let walk = walker.walk(&func);
                let names: Vec<(SymbolName, bool)> = walk
                    .names()
                    .iter()
                    .cloned()
                    .zip(walk.address_taken().iter().copied())
                    .collect();
                (walk.template(), names)
            }))
            .ok()?;
            // Its names are the slots that were not renamed, as used before.
            let mut quotient_slots = Vec::with_capacity(names.len());
            for (name, taken) in &names {
                let number = self.names.find(name.into())?;
                let s = *slot_of.get(&number)?;
                if same[s] as usize != s || slots[s].1 != *taken {
                    return None;
                }
                quotient_slots.push(nodes[node.index()].slots[s]);
            }
            let id = match templates.get(&template) {
                Some(&id) => id,
                None => {
                    let next = TemplateId::new(unique + walked.len());
                    *walked.entry(template).or_insert(next)
                }
            };
            Some(Quotient {
                template: id,
                slots: quotient_slots,
            })
        })
    }

    /// A copy of `func` (a function of a node whose slots are `slots`,
    /// each slot by its name's number in `slot_of`) with the callee of
    /// each slot `s` renamed to that of slot `same[s]`, or `None` if one of
    /// its calls names something no slot has.
    fn renamed(
        &self,
        func: &Function,
        slots: &[(OutsideId, bool)],
        slot_of: &HashMap<OutsideId, usize>,
        same: &[u32],
    ) -> Option<Function> {
        let mut renames = Vec::new();
        for (callee, data) in func.dfg.ext_funcs.iter() {
            let Some(name) = SymbolName::of(func, &data.name) else {
                continue;
            };
            let number = self.names.find((&name).into())?;
            let s = *slot_of.get(&number)?;
            let first = same[s] as usize;
            if first != s {
                renames.push((callee, self.names.get(slots[first].0)));
            }
        }
        let mut func = func.clone();
        for (callee, name) in renames {
            let name = match name {
                NameRef::User(namespace, index) => ExternalName::User(
                    func.declare_imported_user_function(UserExternalName::new(namespace, index)),
                ),
                NameRef::TestCase(bytes) => ExternalName::testcase(bytes),
            };
            func.dfg.ext_funcs[callee].name = name;
        }
        Some(func)
    }
}

/// The start classes of nodes that are alone are numbered apart from
/// numbers of instructions.
const ALONE: u32 = 1 << 31;

// The tests read CLIF with the corpus reader.
#[cfg(all(test, feature = "tools"))]
mod tests {
    use super::*;
    use crate::Fingerprinter;
    use crate::corpus::{FileOutcome, parse_text};
    use crate::refine::RefinedClass;

    /// `(fingerprint, names, address taken, own name)` of each function of
    /// `text`.
    fn parts(text: &str) -> Vec<(Fingerprint, Vec<SymbolName>, Vec<bool>, UserFuncName)> {
        let FileOutcome::Parsed { functions, .. } = parse_text(text, None) else {
            panic!("test CLIF parses");
        };
        let mut fp = Fingerprinter::new();
        functions
            .into_iter()
            .map(|f| {
                assert!(f.verifier_error.is_none(), "{:?}", f.verifier_error);
                let walk = fp.walk(&f.func);
                (
                    walk.fingerprint(),
                    walk.names().to_vec(),
                    walk.address_taken().to_vec(),
                    f.func.name,
                )
            })
            .collect()
    }

    /// `%name` calls `%callee` (through `func_addr` when `by_address`) and
    /// adds 1.
    fn caller(name: &str, callee: &str, by_address: bool) -> String {
        let call = if by_address {
            "    v1 = func_addr.i64 fn0\n    v2 = call_indirect sig0, v1(v0)\n"
        } else {
            "    v2 = call fn0(v0)\n"
        };
        format!(
            "function %{name}(i64) -> i64 {{\n    sig0 = (i64) -> i64\n    fn0 = colocated %{callee} sig0\n\
             block0(v0: i64):\n{call}    v3 = iconst.i64 1\n    v4 = iadd v2, v3\n    return v4\n}}\n"
        )
    }

    fn leaf(name: &str, k: i64) -> String {
        format!(
            "function %{name}(i64) -> i64 {{\nblock0(v0: i64):\n    v1 = iconst.i64 {k}\n    \
             v2 = imul v0, v1\n    return v2\n}}\n"
        )
    }

    /// Classes of the functions of `text`, one node per function (or as
    /// `nodes` says: function `i` goes into node `nodes[i]`), each compared
    /// as it is ([`CallGraph::refine`]).
    fn classes(text: &str, nodes: &[u32]) -> Vec<RefinedClass> {
        classes_of(text, nodes, false)
    }

    /// As [`classes`]; with `as_one`, callees of one class count as one
    /// ([`CallGraph::refine_with`], given each node's first function).
    fn classes_of(text: &str, nodes: &[u32], as_one: bool) -> Vec<RefinedClass> {
        let FileOutcome::Parsed { functions, .. } = parse_text(text, None) else {
            panic!("test CLIF parses");
        };
        let mut graph = CallGraph::new();
        let mut added = 0;
        let mut first = Vec::new();
        for (i, (fingerprint, names, taken, own)) in parts(text).into_iter().enumerate() {
            if nodes[i] == added {
                let node = graph.add_node(&fingerprint, &names, &taken);
                assert_eq!(node.as_u32(), added, "nodes are numbered in order added");
                added += 1;
                first.push(&functions[i].func);
            }
            graph.add_function_with_func_name(&own, NodeId::from_u32(nodes[i]));
        }
        let r = if as_one {
            graph.refine_with(|node| Some(first[node.as_u32() as usize]))
        } else {
            graph.refine()
        };
        nodes
            .iter()
            .map(|&n| r.class_of[NodeId::from_u32(n)])
            .collect()
    }

    /// `%name` calls itself, then multiplies by `k`.
    fn recursive(name: &str, k: i64) -> String {
        format!(
            "function %{name}(i64) -> i64 {{\n    sig0 = (i64) -> i64\n    fn0 = colocated %{name} sig0\n\
             block0(v0: i64):\n    v1 = call fn0(v0)\n    v2 = iconst.i64 {k}\n    \
             v3 = imul v1, v2\n    return v3\n}}\n"
        )
    }

    /// `%name` calls `%first`, then `%second` with the result (one
    /// declaration if they are one name).
    fn calls_two(name: &str, first: &str, second: &str) -> String {
        format!(
            "function %{name}(i64) -> i64 {{\n    sig0 = (i64) -> i64\n    fn0 = colocated %{first} sig0\n    \
             fn1 = colocated %{second} sig0\n\
             block0(v0: i64):\n    v1 = call fn0(v0)\n    v2 = call fn1(v1)\n    return v2\n}}\n"
        )
    }

    #[test]
    fn callees_of_one_class_count_as_one_callee() {
        // f and g are recursive twins (two nodes, one class); h is not.
        let text = [
            recursive("f", 7),
            recursive("g", 7),
            recursive("h", 8),
            calls_two("a", "f", "f"),
            calls_two("b", "f", "g"),
            calls_two("c", "g", "f"),
            calls_two("d", "f", "h"),
            calls_two("e", "h", "f"),
        ]
        .concat();
        let nodes = [0, 1, 2, 3, 4, 5, 6, 7];
        let c = classes_of(&text, &nodes, true);
        assert_eq!(c[0], c[1]);
        assert_ne!(c[0], c[2]);
        assert_eq!(c[3], c[4], "f twice, and f then its twin g");
        assert_eq!(c[3], c[5]);
        assert_ne!(c[3], c[6], "f then h, which differs");
        assert_ne!(c[6], c[7], "the order of different callees matters");
        // Compared as they are, b and c stay apart from a (one slot
        // against two), though not from each other.
        let c = classes_of(&text, &nodes, false);
        assert_ne!(c[3], c[4]);
        assert_eq!(c[4], c[5]);
    }

    #[test]
    fn a_cycle_through_both_twins_merges_with_one_through_one() {
        // p0 calls itself twice; p1 calls p0, then itself: if p1 is p0,
        // it calls p0 twice. q calls itself, then f (another function).
        let text = [
            recursive("f", 7),
            calls_two("p0", "p0", "p0"),
            calls_two("p1", "p0", "p1"),
            calls_two("q", "q", "f"),
            calls_two("r", "p1", "p0"),
        ]
        .concat();
        let nodes = [0, 1, 2, 3, 4];
        let c = classes_of(&text, &nodes, true);
        assert_eq!(c[1], c[2]);
        assert_eq!(c[1], c[4], "r calls p1 and p0, one class");
        assert_ne!(c[1], c[3]);
        // Compared as they are, none merge.
        let c = classes_of(&text, &nodes, false);
        assert_ne!(c[1], c[2]);
        assert_ne!(c[1], c[4]);
    }

    #[test]
    fn callers_of_one_node_merge() {
        // f and g are one node (exact twins); a calls f, b calls g.
        let text = [
            leaf("f", 7),
            leaf("g", 7),
            caller("a", "f", false),
            caller("b", "g", false),
        ]
        .concat();
        let c = classes(&text, &[0, 0, 1, 2]);
        assert_eq!(c[2], c[3]);
    }

    #[test]
    fn callers_of_different_nodes_do_not() {
        let text = [
            leaf("f", 7),
            leaf("g", 8),
            caller("a", "f", false),
            caller("b", "g", false),
        ]
        .concat();
        let c = classes(&text, &[0, 1, 2, 3]);
        assert_ne!(c[2], c[3]);
        assert_ne!(c[0], c[1]);
    }

    #[test]
    fn taken_addresses_and_shared_names_stay_names() {
        // By address: a and b name f and g as data, so they stay apart
        // even though f and g are one node.
        let text = [
            leaf("f", 7),
            leaf("g", 7),
            caller("a", "f", true),
            caller("b", "g", true),
        ]
        .concat();
        let c = classes(&text, &[0, 0, 1, 2]);
        assert_ne!(c[2], c[3]);
        // Two nodes with functions named %f: a name of two nodes is only a
        // name, so callers of %f (one node) and of %h do not merge even
        // though %f's first node and %h are twins.
        let text = [leaf("f", 7), leaf("f", 8), leaf("h", 7)].concat()
            + &caller("a", "f", false)
            + &caller("b", "h", false);
        let c = classes(&text, &[0, 1, 0, 2, 3]);
        assert_ne!(c[3], c[4]);
    }
}
