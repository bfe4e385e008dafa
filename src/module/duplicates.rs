//! Which functions of a batch flush are planned as duplicates of which:
//! one round of planning decided as a value, by a pure function of a key
//! per function, before anything is verified or changed.
//!
//! A flush plans in rounds (`batch.rs`): one over the classes refinement
//! finds on the call graph, then rounds over exact fingerprints until a
//! round plans nothing more. Each round is the same decision, taken here
//! ([`decide`]); the runner verifies what the decision counts on (in
//! [`Round::counts_on`]'s order, stopping at the first failure, which
//! fails that function and makes it take no part in the round decided
//! again), and only then applies it to the ids' states.
//!
//! # What this module guarantees
//!
//! 1. [`decide`] is pure: the same keys give the same round, whatever
//!    was decided before, and nothing else is read.
//! 2. A function with no key takes no part: it is neither a duplicate
//!    nor what one runs.
//! 3. A function whose key a compiled class has is a duplicate of that
//!    class's function (nothing is compiled twice); otherwise, of the
//!    first function of the flush with its key, in definition order,
//!    which is no duplicate. So which function is canonical is determined
//!    by the keys and their order alone.
//! 4. The round counts on every duplicate and on every first function
//!    that has one, each listed once, in definition order: the functions
//!    defined without being compiled and those that their callers'
//!    rewritten references name. A function alone with its key, and a
//!    compiled class's function, are not counted on (the first is defined
//!    as its own plan says, the second is defined already).
//! 5. Deciding again with the key of a function counted on taken away
//!    decides the same for every key it did not share; if it was the
//!    first with its key (no compiled class has that key), the next
//!    function with its key in definition order takes its place, and the
//!    key's other functions are its duplicates.

use cranelift_module::FuncId;
use hashbrown::HashMap;
use std::hash::Hash;

/// What one function brings to a round: its key, and the function that
/// started a compiled class with that key, if any (see 3 above).
#[derive(Clone, Debug)]
pub(super) struct Keyed<K> {
    /// The key: equal keys are functions planned as one.
    pub(super) key: K,
    /// The function of the compiled class this key has, if one does.
    pub(super) compiled: Option<FuncId>,
}

/// What a duplicate is planned to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Canonical {
    /// The function at this index of the flush, the first with its key.
    First(usize),
    /// A compiled class's function.
    Compiled(FuncId),
}

/// One round's decision (see 3 and 4 above).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Round {
    /// Each duplicate, by index in definition order, with what it runs.
    pub(super) duplicates: Vec<(usize, Canonical)>,
    /// The functions the round counts on, by index in definition order.
    pub(super) counts_on: Vec<usize>,
}

/// Decides a round over `keys`, one per function of the flush in
/// definition order (`None` for a function taking no part).
pub(super) fn decide<K: Eq + Hash>(keys: &[Option<Keyed<K>>]) -> Round {
    // The index of each key's first function, and whether it has a
    // duplicate yet.
    let mut first_of: HashMap<&K, (usize, bool)> = HashMap::new();
    let mut duplicates = Vec::new();
    // Whether each function is counted on.
    let mut counted = vec![false; keys.len()];
    for (i, keyed) in keys.iter().enumerate() {
        let Some(Keyed { key, compiled }) = keyed else {
            continue;
        };
        let canonical = match (compiled, first_of.get_mut(key)) {
            (Some(compiled), _) => Canonical::Compiled(*compiled),
            (None, Some((first, has_duplicate))) => {
                *has_duplicate = true;
                counted[*first] = true;
                Canonical::First(*first)
            }
            (None, None) => {
                first_of.insert(key, (i, false));
                continue;
            }
        };
        counted[i] = true;
        duplicates.push((i, canonical));
    }
    let counts_on = counted
        .iter()
        .enumerate()
        .filter_map(|(i, &counted)| counted.then_some(i))
        .collect();
    Round {
        duplicates,
        counts_on,
    }
}

#[cfg(test)]
mod tests {
    use super::{Canonical, Keyed, Round, decide};
    use cranelift_module::FuncId;
    use proptest::prelude::*;

    /// Keys from `(key, compiled)` pairs, `None` for no key.
    fn keyed(keys: &[Option<(u8, Option<u32>)>]) -> Vec<Option<Keyed<u8>>> {
        keys.iter()
            .map(|k| {
                k.map(|(key, compiled)| Keyed {
                    key,
                    compiled: compiled.map(FuncId::from_u32),
                })
            })
            .collect()
    }

    #[test]
    fn the_first_function_with_a_key_is_canonical_and_counted_on_with_its_duplicates() {
        let round = decide(&keyed(&[
            Some((1, None)),
            Some((2, None)),
            None,
            Some((1, None)),
            Some((3, None)),
            Some((1, None)),
        ]));
        assert_eq!(
            round,
            Round {
                duplicates: vec![(3, Canonical::First(0)), (5, Canonical::First(0))],
                // 1 (alone with key 2) and 4 (alone with key 3) are not.
                counts_on: vec![0, 3, 5],
            }
        );
    }

    #[test]
    fn a_compiled_class_wins_over_the_first_function_and_is_not_counted_on() {
        let round = decide(&keyed(&[
            Some((1, None)),
            Some((2, Some(9))),
            Some((1, None)),
            Some((2, Some(9))),
        ]));
        assert_eq!(
            round.duplicates,
            vec![
                (1, Canonical::Compiled(FuncId::from_u32(9))),
                (2, Canonical::First(0)),
                (3, Canonical::Compiled(FuncId::from_u32(9))),
            ]
        );
        assert_eq!(round.counts_on, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_function_alone_with_its_key_is_counted_on_by_nothing() {
        assert_eq!(
            decide(&keyed(&[Some((1, None)), None, Some((2, None))])),
            Round::default()
        );
    }

    #[test]
    fn taking_a_failed_first_away_makes_the_next_one_first() {
        let mut keys = keyed(&[
            Some((1, None)),
            Some((2, None)),
            Some((1, None)),
            Some((1, None)),
        ]);
        let before = decide(&keys);
        assert_eq!(before.counts_on, vec![0, 2, 3]);
        keys[0] = None;
        let after = decide(&keys);
        assert_eq!(after.duplicates, vec![(3, Canonical::First(2))]);
        assert_eq!(after.counts_on, vec![2, 3]);
    }

    /// Keys for the property tests: few distinct keys, so that many are
    /// shared, some compiled (a key's compiled function is one per key).
    fn keys() -> impl Strategy<Value = Vec<Option<Keyed<u8>>>> {
        let compiled = proptest::collection::vec(any::<bool>(), 4);
        (
            compiled,
            proptest::collection::vec(proptest::option::of(0u8..4), 0..24),
        )
            .prop_map(|(compiled, keys)| {
                keys.into_iter()
                    .map(|k| {
                        k.map(|key| Keyed {
                            key,
                            compiled: compiled[key as usize]
                                .then(|| FuncId::from_u32(100 + u32::from(key))),
                        })
                    })
                    .collect()
            })
    }

    proptest! {
        /// 2 to 4 above, against a direct reading of them.
        #[test]
        fn a_round_plans_each_key_onto_one_function(keys in keys()) {
            let round = decide(&keys);
            for (i, keyed) in keys.iter().enumerate() {
                let planned = round.duplicates.iter().find(|(d, _)| *d == i).map(|(_, c)| *c);
                let Some(keyed) = keyed else {
                    prop_assert!(planned.is_none());
                    prop_assert!(!round.counts_on.contains(&i));
                    prop_assert!(!round.duplicates.iter().any(|(_, c)| *c == Canonical::First(i)));
                    continue;
                };
                let first = keys.iter().position(|k| k.as_ref().is_some_and(|k| k.key == keyed.key));
                let expected = match keyed.compiled {
                    Some(f) => Some(Canonical::Compiled(f)),
                    None if first == Some(i) => None,
                    None => Some(Canonical::First(first.expect("its own key"))),
                };
                prop_assert_eq!(planned, expected);
                let has_duplicate = round.duplicates.iter().any(|(_, c)| *c == Canonical::First(i));
                prop_assert_eq!(round.counts_on.contains(&i), planned.is_some() || has_duplicate);
            }
            prop_assert!(round.counts_on.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(round.duplicates.windows(2).all(|w| w[0].0 < w[1].0));
        }

        /// 5 above: taking a counted-on function's key away changes
        /// nothing for the other keys.
        #[test]
        fn taking_a_key_away_changes_only_its_own(keys in keys(), pick in any::<prop::sample::Index>()) {
            let round = decide(&keys);
            prop_assume!(!round.counts_on.is_empty());
            let gone = round.counts_on[pick.index(round.counts_on.len())];
            let key = keys[gone].as_ref().expect("counted on").key;
            let mut fewer = keys.clone();
            fewer[gone] = None;
            let again = decide(&fewer);
            let other = |r: &Round| -> Vec<(usize, Canonical)> {
                r.duplicates.iter().copied()
                    .filter(|(i, _)| keys[*i].as_ref().is_some_and(|k| k.key != key))
                    .collect()
            };
            prop_assert_eq!(other(&round), other(&again));
            // Its key's functions: a first taken away makes way for the
            // next; anything else leaves the rest as they were.
            let same = |r: &Round| -> Vec<(usize, Canonical)> {
                r.duplicates.iter().copied()
                    .filter(|(i, _)| *i != gone && keys[*i].as_ref().is_some_and(|k| k.key == key))
                    .collect()
            };
            let was_first = round.duplicates.iter().any(|(_, c)| *c == Canonical::First(gone));
            if was_first {
                let members: Vec<usize> = (gone + 1..keys.len())
                    .filter(|&i| keys[i].as_ref().is_some_and(|k| k.key == key))
                    .collect();
                let next = members[0];
                let expected: Vec<(usize, Canonical)> =
                    members[1..].iter().map(|&i| (i, Canonical::First(next))).collect();
                prop_assert_eq!(same(&again), expected);
            } else {
                prop_assert_eq!(same(&round), same(&again));
            }
        }
    }
}
