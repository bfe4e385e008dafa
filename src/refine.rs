//! Call-graph refinement: which functions of a set are the same once callees
//! are compared by class instead of by name.
//!
//! Each function is a [`Node`]: its template class (functions with equal
//! [templates](crate::Fingerprint::template)) and, slot by slot, what its
//! name slots refer to: another function of the set, or something outside
//! it (an import, a data symbol, a function whose address is used as data),
//! identified by an interned name.
//!
//! [`refine`] starts from the optimistic partition (one class per template)
//! and splits classes until every class is stable: two functions share a
//! class only if their templates are equal and, for every slot, both refer
//! to functions of one class, or both to the same outside name. This is the
//! coarsest such partition (a bisimulation), so self-recursive twins and
//! mutually recursive twins of any cycle length merge, which a merger that
//! compares callees by name can never prove.
//!
//! # What this module guarantees
//!
//! 1. Soundness: functions in one class have equal templates, and slot `i`
//!    of each refers to functions of one class or to the same outside name.
//!    Calling any member therefore runs the same code, calling members of
//!    the same classes, so merging a class never changes behaviour.
//! 2. Coarsest: starting optimistically and only ever splitting, no two
//!    functions that such a partition could keep together are separated.
//! 3. Determinism: class numbers are dense, in order of each class's first
//!    member in the input, so the result does not depend on hashing.
//! 4. Rounds: each round splits at least one class or ends the loop, so
//!    there are at most as many rounds as functions, plus one.

use crate::fingerprint::SymbolName;
use core::hash::BuildHasher;
use cranelift_codegen::ir::UserExternalName;
use hashbrown::HashMap;

/// What one name slot of a function refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The function at this index of the input.
    Function(u32),
    /// Something outside the set, by an interned name.
    Outside(u32),
}

/// One function: its template class and its slots' targets.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// Functions with equal templates have equal numbers here.
    pub template: u32,
    /// What each name slot refers to, in slot order.
    pub slots: &'a [Target],
}

/// The result of [`refine`].
#[derive(Clone, Debug)]
pub struct Refinement {
    /// The class of each input function, dense from 0.
    pub class_of: Vec<u32>,
    /// Number of classes.
    pub classes: usize,
    /// Rounds until nothing split (the last round changes nothing).
    pub rounds: u32,
}

impl Refinement {
    /// Functions merged into another: input length minus classes.
    pub fn merged(&self) -> usize {
        self.class_of.len() - self.classes
    }
}

/// The coarsest stable partition of `nodes` (see the module docs).
pub fn refine(nodes: &[Node<'_>]) -> Refinement {
    let (mut class_of, templates) = renumber(nodes.iter().map(|n| n.template));
    // A function alone with its template is alone in every partition, so
    // only the others are refined. Their classes are numbered from
    // `templates` up in each round (signatures only hold the classes of
    // the previous round, so each round may reuse that range).
    let mut members = vec![0u32; templates];
    for &c in &class_of {
        members[c as usize] += 1;
    }
    let active: Vec<usize> = (0..nodes.len())
        .filter(|&i| members[class_of[i] as usize] > 1)
        .collect();
    let singletons = templates - members.iter().filter(|&&m| m > 1).count();
    let mut active_classes = templates - singletons;
    let mut rounds = 0;
    let mut signature = Vec::new();
    let mut ids: HashMap<Vec<u32>, u32> = HashMap::new();
    let mut next = vec![0u32; active.len()];
    loop {
        rounds += 1;
        ids.clear();
        for (slot, &i) in next.iter_mut().zip(&active) {
            // The function's class, then each slot's target: a class
            // (even words) or an outside name (odd words).
            signature.clear();
            signature.push(class_of[i]);
            signature.extend(nodes[i].slots.iter().map(|t| match *t {
                Target::Function(f) => class_of[f as usize] << 1,
                Target::Outside(name) => name << 1 | 1,
            }));
            let fresh = templates as u32 + ids.len() as u32;
            *slot = match ids.get(&signature) {
                Some(&id) => id,
                None => {
                    ids.insert(signature.clone(), fresh);
                    fresh
                }
            };
        }
        for (&id, &i) in next.iter().zip(&active) {
            class_of[i] = id;
        }
        // Every new class lies within an old one, so equal counts mean
        // nothing split.
        let split = ids.len() != active_classes;
        active_classes = ids.len();
        if !split {
            break;
        }
    }
    let (class_of, classes) = renumber(class_of.into_iter());
    Refinement {
        class_of,
        classes,
        rounds,
    }
}

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
    /// Every name seen, numbered.
    interned: HashMap<SymbolName, u32>,
    /// Per name number: which node has functions of that name.
    owners: Vec<Owner>,
    nodes: Vec<NodeEntry>,
    /// All nodes' slots (name numbers, address taken), one after another.
    slots: Vec<(u32, bool)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Nobody,
    Node(u32),
    Several,
}

struct NodeEntry {
    template: u32,
    /// Range of this node's slots in `slots`.
    slots: core::ops::Range<usize>,
}

/// A name to look up without owning it.
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

impl NameRef<'_> {
    fn to_owned(self) -> SymbolName {
        match self {
            NameRef::User(namespace, index) => {
                SymbolName::User(UserExternalName::new(namespace, index))
            }
            NameRef::TestCase(bytes) => SymbolName::TestCase(bytes.into()),
        }
    }
}

impl CallGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of `name`, giving it one on first sight.
    fn intern(&mut self, name: NameRef<'_>) -> u32 {
        let hasher = *self.interned.hasher();
        let hash = hasher.hash_one(name);
        let fresh = self.owners.len() as u32;
        let entry = self
            .interned
            .raw_entry_mut()
            .from_hash(hash, |k| NameRef::from(k) == name);
        match entry {
            hashbrown::hash_map::RawEntryMut::Occupied(e) => *e.get(),
            hashbrown::hash_map::RawEntryMut::Vacant(e) => {
                e.insert_with_hasher(hash, name.to_owned(), fresh, |k| {
                    hasher.hash_one(NameRef::from(k))
                });
                self.owners.push(Owner::Nobody);
                fresh
            }
        }
    }

    /// Adds a node: functions whose template has number `template` (nodes
    /// with equal templates must have equal numbers, e.g. the classes of a
    /// [`DedupCache`](crate::DedupCache) of templates), with these slot
    /// names and address-taken flags (see
    /// [`crate::Fingerprinter::last_names`] and
    /// [`crate::Fingerprinter::last_address_taken`]). Returns its index;
    /// nodes are numbered from 0 in the order added.
    pub fn add_node(&mut self, template: u32, names: &[SymbolName], address_taken: &[bool]) -> u32 {
        let start = self.slots.len();
        for (name, &taken) in names.iter().zip(address_taken) {
            let number = self.intern(name.into());
            self.slots.push((number, taken));
        }
        self.nodes.push(NodeEntry {
            template,
            slots: start..self.slots.len(),
        });
        self.nodes.len() as u32 - 1
    }

    /// Records that a function named `name` belongs to `node`.
    pub fn add_function(&mut self, name: &SymbolName, node: u32) {
        self.add_function_named(name.into(), node);
    }

    /// Records that a function whose `ir::Function::name` is `name` belongs
    /// to `node` (without copying the name unless it is new).
    pub fn add_function_with_func_name(
        &mut self,
        name: &cranelift_codegen::ir::UserFuncName,
        node: u32,
    ) {
        let name = match name {
            cranelift_codegen::ir::UserFuncName::User(user) => {
                NameRef::User(user.namespace, user.index)
            }
            cranelift_codegen::ir::UserFuncName::Testcase(name) => NameRef::TestCase(name.raw()),
        };
        self.add_function_named(name, node);
    }

    fn add_function_named(&mut self, name: NameRef<'_>, node: u32) {
        let number = self.intern(name) as usize;
        self.owners[number] = match self.owners[number] {
            Owner::Nobody => Owner::Node(node),
            Owner::Node(n) if n == node => Owner::Node(n),
            Owner::Node(_) | Owner::Several => Owner::Several,
        };
    }

    /// Number of nodes added.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Resolves the names and refines the nodes; classes are numbered as in
    /// [`refine`], nodes as returned by [`CallGraph::add_node`].
    pub fn refine(&self) -> Refinement {
        // A node alone with its template never merges, so its slots need
        // no resolving (`refine` does not look at them).
        let mut per_template: HashMap<u32, u32> = HashMap::new();
        for n in &self.nodes {
            *per_template.entry(n.template).or_insert(0) += 1;
        }
        let mut targets = Vec::with_capacity(self.slots.len());
        let mut ranges = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let start = targets.len();
            if per_template[&n.template] > 1 {
                targets.extend(self.slots[n.slots.clone()].iter().map(|&(name, taken)| {
                    match self.owners[name as usize] {
                        Owner::Node(node) if !taken => Target::Function(node),
                        _ => Target::Outside(name),
                    }
                }));
            }
            ranges.push(start..targets.len());
        }
        let nodes: Vec<Node<'_>> = self
            .nodes
            .iter()
            .zip(ranges)
            .map(|(n, range)| Node {
                template: n.template,
                slots: &targets[range],
            })
            .collect();
        refine(&nodes)
    }
}

/// Dense numbers for `keys`, in order of first appearance.
fn renumber(keys: impl Iterator<Item = u32>) -> (Vec<u32>, usize) {
    let mut ids: HashMap<u32, u32> = HashMap::new();
    let out = keys
        .map(|k| {
            let fresh = ids.len() as u32;
            *ids.entry(k).or_insert(fresh)
        })
        .collect();
    (out, ids.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(template: u32, slots: &[Target]) -> Node<'_> {
        Node { template, slots }
    }

    use Target::{Function as F, Outside as O};

    #[test]
    fn recursive_twins_merge_and_a_differing_cycle_does_not() {
        let nodes = [
            // fact0, fact1: self-recursive twins.
            node(0, &[F(0)]),
            node(0, &[F(1)]),
            // ping0/pong0 and ping1/pong1.
            node(1, &[F(3)]),
            node(2, &[F(2)]),
            node(1, &[F(5)]),
            node(2, &[F(4)]),
            // ping2/pong2: pong2 has another template (another constant).
            node(1, &[F(7)]),
            node(3, &[F(6)]),
            // A 3-cycle twice, and a 3-cycle whose last member calls out.
            node(4, &[F(9)]),
            node(4, &[F(10)]),
            node(4, &[F(8)]),
            node(4, &[F(12)]),
            node(4, &[F(13)]),
            node(4, &[F(11)]),
            node(4, &[F(15)]),
            node(4, &[F(16)]),
            node(4, &[O(0)]),
        ];
        let r = refine(&nodes);
        let c = &r.class_of;
        assert_eq!(c[0], c[1]);
        assert_eq!((c[2], c[3]), (c[4], c[5]));
        assert_ne!(c[2], c[3]);
        assert_ne!(c[6], c[2], "ping2 calls a pong that differs");
        assert_ne!(c[7], c[3]);
        for i in 9..=13 {
            assert_eq!(c[i], c[8], "all members of the two 3-cycles");
        }
        // The calls-out chain splits from the cycles, one member per round.
        assert_ne!(c[16], c[8]);
        assert_ne!(c[15], c[8]);
        assert_ne!(c[14], c[8]);
        assert_ne!(c[14], c[15]);
        assert!(r.rounds >= 3, "{}", r.rounds);
        assert_eq!(r.classes, *c.iter().max().unwrap() as usize + 1);
    }

    #[test]
    fn outside_names_and_slot_order_matter() {
        let nodes = [
            node(0, &[O(1), O(2)]),
            node(0, &[O(1), O(2)]),
            node(0, &[O(2), O(1)]),
            node(0, &[O(1), O(3)]),
        ];
        let r = refine(&nodes);
        assert_eq!(r.class_of, [0, 0, 1, 2]);
        assert_eq!(r.merged(), 1);
        assert_eq!(r.rounds, 2, "one round splits, one finds nothing to split");
    }
}
