//! Call-graph refinement: which functions of a set are the same once callees
//! are compared by class instead of by name.
//!
//! Each function is a [`Node`]: its template class (functions with equal
//! [templates](crate::Fingerprint::to_template)) and, slot by slot, what its
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
//! # Index spaces
//!
//! Four numberings meet here, each with its own type, so that passing one
//! where another is meant does not compile:
//!
//! - [`NodeId`]: a function of the input (its index in the slice given to
//!   [`refine`], or a node of a [`CallGraph`], in the order added);
//! - [`OutsideId`]: an interned name outside the set;
//! - [`TemplateId`]: a template class;
//! - [`RefinedClass`]: a class of the result.
//!
//! ```
//! use jitfold::refine::{Node, NodeId, OutsideId, Target, TemplateId, refine};
//! let slots = [Target::Function(NodeId::from_u32(0)), Target::Outside(OutsideId::from_u32(0))];
//! let node = Node { template: TemplateId::from_u32(0), slots: &slots };
//! let r = refine(&[node]);
//! assert_eq!(r.class_of[NodeId::from_u32(0)].as_u32(), 0);
//! ```
//!
//! ```compile_fail
//! use jitfold::refine::{OutsideId, Target};
//! // An outside name is not a function of the set.
//! let _ = Target::Function(OutsideId::from_u32(0));
//! ```
//!
//! # What this module guarantees
//!
//! 1. Soundness: functions in one class have equal templates, and slot `i`
//!    of each refers to functions of one class or to the same outside name.
//!    Calling any member therefore runs the same code, calling members of
//!    the same classes, so merging a class never changes behaviour.
//! 2. Coarsest: starting optimistically and only ever splitting, no two
//!    functions that such a partition could keep together are separated.
//! 3. Determinism: class numbers ([`RefinedClass`]) are dense, in order of
//!    each class's first member in the input, so the result does not depend
//!    on hashing.
//! 4. Rounds: each round splits at least one class or ends the loop, so
//!    there are at most as many rounds as functions, plus one.
//!
//! [`refine_identifying`] also counts a function's callees of one class as
//! one callee (a function that calls `g0` and then its twin `g1` is the
//! function that calls `g0` twice): in each round a function with two
//! slots of one class is compared as its function with those callees
//! renamed to one, walked again by the caller
//! ([`CallGraph::refine_with`] does it). 1, 3 and 4 hold as stated, with
//! "equal templates" read of the renamed functions; 2 holds as long as
//! every function can be walked again and the start classes are coarser
//! than any stable partition ([`CallGraph`] starts from the number of
//! instructions, which renaming callees does not change).

mod graph;

use core::hash::BuildHasher;
use cranelift_codegen::entity::{EntityRef, PrimaryMap, entity_impl};
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};

pub use graph::CallGraph;

/// A function of the input: its index in the nodes given to [`refine`],
/// or a node of a [`CallGraph`], numbered from 0 in the order added.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);
entity_impl!(NodeId, "node");

/// An interned name of something outside the set: equal names have equal
/// ids, different names different ones.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OutsideId(u32);
entity_impl!(OutsideId, "outside");

/// A template class: functions with equal templates have equal ids. Any
/// numbers will do (they need not be dense).
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateId(u32);
entity_impl!(TemplateId, "template");

/// A class of a [`Refinement`]: dense from 0, in order of each class's
/// first member in the input.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RefinedClass(u32);
entity_impl!(RefinedClass, "refined");

/// What one name slot of a function refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// A function of the set.
    Function(NodeId),
    /// Something outside the set, by an interned name.
    Outside(OutsideId),
}

/// One function: its template class and its slots' targets.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// Functions with equal templates have equal ids here.
    pub template: TemplateId,
    /// What each name slot refers to, in slot order.
    pub slots: &'a [Target],
}

/// The result of [`refine`].
#[derive(Clone, Debug)]
pub struct Refinement {
    /// The class of each input function.
    pub class_of: PrimaryMap<NodeId, RefinedClass>,
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

/// The coarsest stable partition of `nodes` (see the module docs); node
/// `i` of `nodes` is `NodeId::new(i)`. Each function is compared as it
/// is: one that calls two functions of one class is not compared with one
/// that calls either of them twice (see [`refine_identifying`]).
pub fn refine(nodes: &[Node<'_>]) -> Refinement {
    let start = nodes.iter().map(|n| n.template.as_u32());
    refine_rounds(nodes, start, None::<fn(NodeId, &[u32]) -> Option<Quotient>>)
}

/// A node with some of its slots taken as one (see [`refine_identifying`]):
/// the template and slots of the function its slots' names were made
/// equal in, walked again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quotient {
    /// The template of the function with the names made equal; comparable
    /// with every node's [`Node::template`].
    pub template: TemplateId,
    /// What each of its slots refers to, in its slot order.
    pub slots: Vec<Target>,
}

/// The coarsest stable partition of `nodes` when a function's callees of
/// one class count as one callee: a function that calls `g0` and then its
/// twin `g1` is the function that calls `g0` twice.
///
/// In each round, the slots of a node that refer to functions of one class
/// are taken as one: `quotient(node, same)` is asked for the node with
/// slot `s` renamed to slot `same[s]` (the first of its slots in the class
/// of slot `s`'s target; `same[s] == s` for every other slot), and the
/// node is compared by what it returns; `None` compares the node as it is
/// (which only keeps it apart from more functions). Where no slots are
/// taken as one, the node is compared as it is.
///
/// `start` is a number per node that two functions of one class of the
/// result must share (the template's when nothing is taken as one; when
/// slots may be, something renaming callees does not change, such as the
/// number of instructions): the rounds only split classes, starting from
/// the classes of `start`, so a node alone with its number is alone in the
/// result, and there are at most as many rounds as nodes, plus one.
///
/// Soundness holds whatever `quotient` returns, as long as each
/// [`Quotient`] is what its node's function is with the names renamed:
/// two nodes share a class only if, with each callee renamed to the first
/// of its class among the function's callees, both are the same function
/// calling functions of the same classes (or the same outside names).
pub fn refine_identifying(
    nodes: &[Node<'_>],
    start: impl ExactSizeIterator<Item = u32> + Clone,
    quotient: impl FnMut(NodeId, &[u32]) -> Option<Quotient>,
) -> Refinement {
    refine_rounds(nodes, start, Some(quotient))
}

/// The rounds of [`refine`] (no `quotient`: no slots are taken as one) and
/// [`refine_identifying`].
fn refine_rounds(
    nodes: &[Node<'_>],
    start: impl ExactSizeIterator<Item = u32> + Clone,
    mut quotient: Option<impl FnMut(NodeId, &[u32]) -> Option<Quotient>>,
) -> Refinement {
    // Classes are plain numbers while rounds run: the start classes
    // first, then each round's from `starts` up.
    let (mut class_of, starts) = renumber(start);
    debug_assert_eq!(class_of.len(), nodes.len());
    // A function alone with its start class is alone in every partition,
    // so only the others are refined. Their classes are numbered from
    // `starts` up in each round (signatures only hold the classes of the
    // previous round, so each round may reuse that range).
    let mut members = vec![0u32; starts];
    for &c in &class_of {
        members[c as usize] += 1;
    }
    let active: Vec<usize> = (0..nodes.len())
        .filter(|&i| members[class_of[i] as usize] > 1)
        .collect();
    let mut active_classes = members.iter().filter(|&&m| m > 1).count();
    let mut rounds = 0;
    let mut signature = Vec::new();
    let mut signatures = SignatureTable::default();
    let mut next = vec![0u32; active.len()];
    let mut same = Vec::new();
    let mut first = HashMap::new();
    // The last quotient asked for each active node, by its `same`.
    let mut asked: Vec<Option<(Vec<u32>, Option<Quotient>)>> =
        vec![None; if quotient.is_some() { active.len() } else { 0 }];
    loop {
        rounds += 1;
        signatures.clear();
        for (k, &i) in active.iter().enumerate() {
            let node = &nodes[i];
            let identifying = quotient.as_mut().filter(|_| {
                node.slots.len() > 1 && same_slots(node.slots, &class_of, &mut first, &mut same)
            });
            let (template, slots) = if let Some(quotient) = identifying {
                let memo = &mut asked[k];
                if memo.as_ref().is_none_or(|(asked, _)| *asked != same) {
                    let q = quotient(NodeId::new(i), &same);
                    *memo = Some((same.clone(), q));
                }
                match memo {
                    Some((_, Some(q))) => (q.template, &q.slots[..]),
                    _ => (node.template, node.slots),
                }
            } else {
                (node.template, node.slots)
            };
            // The function's class and template, then each slot's target:
            // a class (even words) or an outside name (odd words).
            signature.clear();
            signature.push(class_of[i]);
            signature.push(template.as_u32());
            signature.extend(slots.iter().map(|t| match *t {
                Target::Function(f) => class_of[f.index()] << 1,
                Target::Outside(name) => name.as_u32() << 1 | 1,
            }));
            next[k] = starts as u32 + signatures.number(&signature);
        }
        for (&id, &i) in next.iter().zip(&active) {
            class_of[i] = id;
        }
        // Every new class lies within an old one, so equal counts mean
        // nothing split.
        let split = signatures.len() != active_classes;
        active_classes = signatures.len();
        if !split {
            break;
        }
    }
    let (class_of, classes) = renumber(class_of.iter().copied());
    Refinement {
        class_of: class_of.into_iter().map(RefinedClass::from_u32).collect(),
        classes,
        rounds,
    }
}

/// Fills `same` with, for each slot, the first slot referring to a function
/// of the same class under `class_of` (itself for outside names and first
/// slots); returns whether any slot is not its own. `first` is scratch:
/// the first slot of each class seen (linear in the slots).
fn same_slots(
    slots: &[Target],
    class_of: &[u32],
    first: &mut HashMap<u32, u32>,
    same: &mut Vec<u32>,
) -> bool {
    same.clear();
    first.clear();
    let mut any = false;
    for (s, target) in slots.iter().enumerate() {
        let own = s as u32;
        let first = match *target {
            Target::Function(f) => *first.entry(class_of[f.index()]).or_insert(own),
            Target::Outside(_) => own,
        };
        any |= first != own;
        same.push(first);
    }
    any
}

/// Distinct signatures numbered in order of first appearance, stored one
/// after another in one buffer (no allocation per signature).
#[derive(Default)]
struct SignatureTable {
    words: Vec<u32>,
    /// (start in `words`, length, number).
    table: HashTable<(u32, u32, u32)>,
    hasher: DefaultHashBuilder,
}

impl SignatureTable {
    fn clear(&mut self) {
        self.words.clear();
        self.table.clear();
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    /// The number of `signature`, giving it the next one if it is new.
    fn number(&mut self, signature: &[u32]) -> u32 {
        let hash = self.hasher.hash_one(signature);
        let words = &self.words;
        let stored = |&(start, len, _): &(u32, u32, u32)| &words[start as usize..][..len as usize];
        if let Some(&(_, _, n)) = self.table.find(hash, |e| stored(e) == signature) {
            return n;
        }
        let n = self.table.len() as u32;
        let start = self.words.len() as u32;
        self.words.extend_from_slice(signature);
        let (words, hasher) = (&self.words, &self.hasher);
        self.table.insert_unique(
            hash,
            (start, signature.len() as u32, n),
            |&(start, len, _)| hasher.hash_one(&words[start as usize..][..len as usize]),
        );
        n
    }
}

/// Dense numbers for `keys`, in order of first appearance.
fn renumber(keys: impl ExactSizeIterator<Item = u32> + Clone) -> (Vec<u32>, usize) {
    let len = keys.len();
    let max = keys.clone().max().unwrap_or(0) as usize;
    let mut count = 0u32;
    let mut fresh = |slot: &mut u32| {
        if *slot == u32::MAX {
            *slot = count;
            count += 1;
        }
        *slot
    };
    let out = if max <= 4 * len + 1024 {
        // Small keys (class numbers, usually): a table indexed by key.
        let mut ids = vec![u32::MAX; max + 1];
        keys.map(|k| fresh(&mut ids[k as usize])).collect()
    } else {
        let mut ids: HashMap<u32, u32> = HashMap::new();
        keys.map(|k| fresh(ids.entry(k).or_insert(u32::MAX)))
            .collect()
    };
    (out, count as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot as the tests write it: a call of node `F(n)`, or outside name
    /// `O(n)`.
    #[derive(Clone, Copy)]
    enum Slot {
        F(u32),
        O(u32),
    }

    use Slot::{F, O};

    /// A function: its template class and slots.
    fn node(template: u32, slots: &[Slot]) -> (u32, &[Slot]) {
        (template, slots)
    }

    /// [`refine`] of `functions`.
    fn refine_all(functions: &[(u32, &[Slot])]) -> Refinement {
        let slots: Vec<Vec<Target>> = functions
            .iter()
            .map(|(_, slots)| {
                slots
                    .iter()
                    .map(|&slot| match slot {
                        F(n) => Target::Function(NodeId::from_u32(n)),
                        O(n) => Target::Outside(OutsideId::from_u32(n)),
                    })
                    .collect()
            })
            .collect();
        let nodes: Vec<Node<'_>> = functions
            .iter()
            .zip(&slots)
            .map(|(&(template, _), slots)| Node {
                template: TemplateId::from_u32(template),
                slots,
            })
            .collect();
        refine(&nodes)
    }

    /// The class of each node, in input order.
    fn classes(r: &Refinement) -> Vec<u32> {
        r.class_of.values().map(|c| c.as_u32()).collect()
    }

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
        let r = refine_all(&nodes);
        let c = &classes(&r);
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

    /// Nodes 0 and 1 are self-recursive twins; node 2 calls 0 once,
    /// node 3 calls 0 and then 1, which taken as one is node 2's function
    /// (as `quotient` says), and node 4 calls 0 and an outside name.
    fn identified(quotient_known: bool) -> Vec<u32> {
        let t = |n| Target::Function(NodeId::from_u32(n));
        let slots = [
            vec![t(0)],
            vec![t(1)],
            vec![t(0)],
            vec![t(0), t(1)],
            vec![t(0), Target::Outside(OutsideId::from_u32(0))],
        ];
        let templates = [0, 0, 1, 2, 3];
        let nodes: Vec<Node<'_>> = slots
            .iter()
            .zip(templates)
            .map(|(slots, template)| Node {
                template: TemplateId::from_u32(template),
                slots,
            })
            .collect();
        // Every node but the twins has 3 instructions, say.
        let start = [5, 5, 3, 3, 3].into_iter();
        let mut asked = Vec::new();
        let r = refine_identifying(&nodes, start, |node, same| {
            asked.push((node.as_u32(), same.to_vec()));
            (quotient_known && node.as_u32() == 3).then(|| Quotient {
                template: TemplateId::from_u32(1),
                slots: vec![t(0)],
            })
        });
        // Only node 3 has two slots of one class, asked once: the memo
        // answers later rounds.
        assert_eq!(asked, [(3, vec![0, 0])]);
        classes(&r)
    }

    #[test]
    fn slots_of_one_class_are_taken_as_one_where_the_quotient_says() {
        let c = identified(true);
        assert_eq!(c[0], c[1]);
        assert_eq!(c[2], c[3]);
        assert_ne!(c[2], c[4]);
        // Without a quotient, node 3 is compared as it is.
        let c = identified(false);
        assert_ne!(c[2], c[3]);
        assert_eq!(c[0], c[1]);
    }

    #[test]
    fn outside_names_and_slot_order_matter() {
        let nodes = [
            node(0, &[O(1), O(2)]),
            node(0, &[O(1), O(2)]),
            node(0, &[O(2), O(1)]),
            node(0, &[O(1), O(3)]),
        ];
        let r = refine_all(&nodes);
        assert_eq!(classes(&r), [0, 0, 1, 2]);
        assert_eq!(r.merged(), 1);
        assert_eq!(r.rounds, 2, "one round splits, one finds nothing to split");
    }
}
