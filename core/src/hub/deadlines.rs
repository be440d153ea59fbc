//! In-flight deadlines: which delivery times out when.

use std::collections::BTreeMap;
use std::hash::Hash;

use crate::fast::FastSet;

/// The deliveries in flight by ACK deadline (`T`: the hub's key and consumer): what a
/// `BTreeSet<(deadline, key, consumer)>` held, in the same order (see
/// [`Deadlines::take_due`]), for an integer-keyed B-tree and a hash per insert and remove.
/// Every delivery inserts one and every ACK removes one; as a set of triples each did a
/// B-tree walk comparing 24-byte keys, ~9 % of the dispatcher's core in a 100k burst
/// (issue 29).
///
/// Invariant: no instant holds an empty set.
#[derive(Debug)]
pub(super) struct Deadlines<T> {
    by_ms: BTreeMap<i64, FastSet<T>>,
}

impl<T> Default for Deadlines<T> {
    fn default() -> Self {
        Deadlines {
            by_ms: BTreeMap::new(),
        }
    }
}

impl<T: Copy + Ord + Hash> Deadlines<T> {
    pub(super) fn insert(&mut self, deadline_ms: i64, t: T) {
        self.by_ms.entry(deadline_ms).or_default().insert(t);
    }

    /// Forgets one; false if it was not held.
    pub(super) fn remove(&mut self, deadline_ms: i64, t: T) -> bool {
        let Some(at) = self.by_ms.get_mut(&deadline_ms) else {
            return false;
        };
        let held = at.remove(&t);
        if at.is_empty() {
            self.by_ms.remove(&deadline_ms);
        }
        held
    }

    /// The earliest deadline.
    pub(super) fn first(&self) -> Option<i64> {
        self.by_ms.first_key_value().map(|(d, _)| *d)
    }

    /// Takes everything whose deadline is at or before `now_ms`, ordered by (deadline, `T`).
    pub(super) fn take_due(&mut self, now_ms: i64) -> Vec<(i64, T)> {
        let mut due = Vec::new();
        while let Some(at) = self.by_ms.first_entry() {
            if *at.key() > now_ms {
                break;
            }
            let deadline = *at.key();
            let mut these: Vec<T> = at.remove().into_iter().collect();
            these.sort_unstable();
            due.extend(these.into_iter().map(|t| (deadline, t)));
        }
        due
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_ms.values().map(FastSet::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::key::{Bucket, EventId, EventKey, TopicHash};

    fn key(id: u64) -> EventKey {
        EventKey::new(TopicHash(7), Bucket(id % 3), EventId(id))
    }

    proptest! {
        /// Any sequence of inserts, removes and takes: the same answers, in the same order,
        /// as a set of (deadline, key, consumer).
        #[test]
        fn behaves_as_an_ordered_set_of_triples(ops in proptest::collection::vec((0u8..4, 0i64..20, 0u64..12, 0u64..3), 1..200)) {
            let mut d = Deadlines::default();
            let mut model: BTreeSet<(i64, (EventKey, u64))> = BTreeSet::new();
            for (op, at, id, c) in ops {
                let t = (key(id), c);
                match op {
                    0 | 1 => {
                        d.insert(at, t);
                        model.insert((at, t));
                    }
                    2 => prop_assert_eq!(d.remove(at, t), model.remove(&(at, t))),
                    _ => {
                        let want: Vec<_> = model.iter().copied().take_while(|x| x.0 <= at).collect();
                        for x in &want {
                            model.remove(x);
                        }
                        prop_assert_eq!(d.take_due(at), want);
                    }
                }
                prop_assert_eq!(d.first(), model.first().map(|t| t.0));
                prop_assert_eq!(d.len(), model.len());
                prop_assert!(d.by_ms.values().all(|s| !s.is_empty()));
            }
        }
    }
}
