//! Who may assign event ids on the Raft core, and the next one: a pure state machine (the
//! term and the leadership are passed in).
//!
//! # Invariants
//! - Ids are assigned only in a term this node confirmed (its log applied up to its own first
//!   entry of the term, so the store's high-water mark covers every earlier leader's ids),
//!   starting above that mark: ids never regress across failovers and restarts.
//! - Ids ascend in the order they are assigned (the order of the proposals in the log).
//! - At most one confirmation runs at a time.

/// The id allocator of one node.
#[derive(Debug)]
pub struct Ids {
    /// Next id to assign (meaningful only while `ready_term` is the current term).
    next: u64,
    /// The term this node confirmed its leadership in (0 = none).
    ready_term: u64,
    confirming: bool,
}

impl Default for Ids {
    fn default() -> Self {
        Ids {
            next: 1,
            ready_term: 0,
            confirming: false,
        }
    }
}

impl Ids {
    /// Whether this node takes writes: it leads `term` and confirmed it.
    #[must_use]
    pub fn ready(&self, leading: bool, term: u64) -> bool {
        leading && term != 0 && self.ready_term == term
    }

    /// Whether a confirmation of `term` should start now (this node leads it, has not
    /// confirmed it, and none runs); if so, one is marked running.
    pub fn start_confirming(&mut self, leading: bool, term: u64) -> bool {
        if !leading || term == 0 || self.ready_term == term || self.confirming {
            return false;
        }
        self.confirming = true;
        true
    }

    /// The running confirmation ended: `Some((term, high_water))` when it confirmed `term`
    /// with the store's largest applied id, `None` when it did not.
    pub fn confirmed(&mut self, outcome: Option<(u64, u64)>) {
        self.confirming = false;
        if let Some((term, high_water)) = outcome {
            self.next = self.next.max(high_water.saturating_add(1));
            self.ready_term = term;
        }
    }

    /// Assigns `n` consecutive ids if this node takes writes in `term`; the first one.
    pub fn assign(&mut self, leading: bool, term: u64, n: u64) -> Option<u64> {
        if !self.ready(leading, term) {
            return None;
        }
        let first = self.next;
        self.next = first.saturating_add(n);
        Some(first)
    }

    /// The next id to assign (for logs).
    #[must_use]
    pub fn next(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_assigned_before_the_term_is_confirmed() {
        let mut ids = Ids::default();
        assert_eq!(ids.assign(true, 1, 1), None);
        assert!(ids.start_confirming(true, 1));
        assert_eq!(ids.assign(true, 1, 1), None, "confirmation still running");
        ids.confirmed(Some((1, 0)));
        assert_eq!(ids.assign(true, 1, 3), Some(1));
        assert_eq!(ids.assign(true, 1, 2), Some(4));
        assert_eq!(ids.next(), 6);
    }

    #[test]
    fn one_confirmation_at_a_time_and_only_when_leading() {
        let mut ids = Ids::default();
        assert!(!ids.start_confirming(false, 1));
        assert!(!ids.start_confirming(true, 0));
        assert!(ids.start_confirming(true, 1));
        assert!(!ids.start_confirming(true, 1));
        assert!(!ids.start_confirming(true, 2), "one running");
        ids.confirmed(None);
        assert!(!ids.ready(true, 1));
        assert!(
            ids.start_confirming(true, 1),
            "a failed confirmation is retried"
        );
        ids.confirmed(Some((1, 0)));
        assert!(!ids.start_confirming(true, 1), "confirmed already");
    }

    #[test]
    fn a_new_term_or_a_lost_leadership_stops_assignment() {
        let mut ids = Ids::default();
        assert!(ids.start_confirming(true, 3));
        ids.confirmed(Some((3, 10)));
        assert_eq!(ids.assign(true, 3, 1), Some(11));
        assert_eq!(ids.assign(false, 3, 1), None);
        assert_eq!(ids.assign(true, 4, 1), None);
        assert!(ids.start_confirming(true, 4));
    }

    proptest::proptest! {
        /// Any sequence of leadership changes, confirmations and assignments: the ids
        /// handed out ascend, and each is above every high-water mark confirmed before it.
        #[test]
        fn assigned_ids_ascend_above_every_confirmed_mark(
            ops in proptest::collection::vec((0u8..4, 0u64..4, 0u64..1000, 1u64..50), 1..200)
        ) {
            let mut ids = Ids::default();
            let (mut last_end, mut mark) = (0u64, 0u64);
            for (op, term, high_water, n) in ops {
                match op {
                    0 => { ids.start_confirming(true, term); }
                    1 => {
                        ids.confirmed(Some((term, high_water)));
                        mark = mark.max(high_water);
                    }
                    2 => ids.confirmed(None),
                    _ => {
                        if let Some(first) = ids.assign(true, term, n) {
                            proptest::prop_assert!(first > last_end.max(mark));
                            last_end = first + n - 1;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ids_start_above_the_high_water_mark_and_never_regress() {
        let mut ids = Ids::default();
        assert!(ids.start_confirming(true, 1));
        ids.confirmed(Some((1, 100)));
        assert_eq!(ids.assign(true, 1, 50), Some(101));
        // A later term whose store mark is lower (this node's own ids were not applied
        // anywhere yet) keeps the counter where it was.
        assert!(ids.start_confirming(true, 2));
        ids.confirmed(Some((2, 120)));
        assert_eq!(ids.assign(true, 2, 1), Some(151));
        assert!(ids.start_confirming(true, 3));
        ids.confirmed(Some((3, 500)));
        assert_eq!(ids.assign(true, 3, 1), Some(501));
    }
}
