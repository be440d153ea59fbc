//! Who may assign event ids on the Raft core, and the next one: a pure state machine (the
//! term and the leadership are passed in).
//!
//! # Invariants
//! - Ids are assigned only in a term this node confirmed: its log applied up to its own first
//!   entry of the term (so the store's high-water mark `h` covers every id an earlier leader
//!   had committed), and then a committed `ReserveIds` raised the mark to
//!   `h + IDS_UNAPPLIED_MAX`. Ids start above it: they never regress across failovers and
//!   restarts.
//! - **A tag names one message.** A leader hands out no id more than `IDS_UNAPPLIED_MAX`
//!   above the mark its own store applied. Everything a former leader applied was committed,
//!   so is at most `h`; whatever it handed out and lost (a NO_ACK or LEADER entry cut by the
//!   new leader) is at most `h + IDS_UNAPPLIED_MAX`, below every id handed out from then on.
//! - Ids ascend in the order they are assigned (the order of the proposals in the log).
//! - At most one confirmation runs at a time.

use futureq_core::command::IDS_UNAPPLIED_MAX;

/// Why no ids were assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// This node does not take writes in the term (not leading, or not confirmed).
    NotReady,
    /// The ids would go more than [`IDS_UNAPPLIED_MAX`] above the applied mark: the entries
    /// before them must apply first.
    TooFarAhead,
}

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

    /// The running confirmation ended: `Some((term, floor))` when it confirmed `term` and
    /// committed a reservation of the ids up to `floor` (see the module docs), `None` when it
    /// did not.
    pub fn confirmed(&mut self, outcome: Option<(u64, u64)>) {
        self.confirming = false;
        if let Some((term, high_water)) = outcome {
            self.next = self.next.max(high_water.saturating_add(1));
            self.ready_term = term;
        }
    }

    /// Assigns `n` consecutive ids if this node takes writes in `term` and the last of them
    /// is at most [`IDS_UNAPPLIED_MAX`] above `applied` (the highest id its store applied);
    /// the first one.
    ///
    /// # Errors
    /// [`Refused::NotReady`], [`Refused::TooFarAhead`] (nothing assigned).
    pub fn assign(
        &mut self,
        leading: bool,
        term: u64,
        n: u64,
        applied: u64,
    ) -> Result<u64, Refused> {
        if !self.ready(leading, term) {
            return Err(Refused::NotReady);
        }
        let first = self.next;
        let last = first.saturating_add(n.saturating_sub(1));
        if last > applied.saturating_add(IDS_UNAPPLIED_MAX) {
            return Err(Refused::TooFarAhead);
        }
        self.next = first.saturating_add(n);
        Ok(first)
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

    /// An applied mark that never limits.
    const FAR: u64 = u64::MAX;

    #[test]
    fn nothing_is_assigned_before_the_term_is_confirmed() {
        let mut ids = Ids::default();
        assert_eq!(ids.assign(true, 1, 1, FAR).ok(), None);
        assert!(ids.start_confirming(true, 1));
        assert_eq!(
            ids.assign(true, 1, 1, FAR).ok(),
            None,
            "confirmation still running"
        );
        ids.confirmed(Some((1, 0)));
        assert_eq!(ids.assign(true, 1, 3, FAR).ok(), Some(1));
        assert_eq!(ids.assign(true, 1, 2, FAR).ok(), Some(4));
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
        assert_eq!(ids.assign(true, 3, 1, FAR).ok(), Some(11));
        assert_eq!(ids.assign(false, 3, 1, FAR).ok(), None);
        assert_eq!(ids.assign(true, 4, 1, FAR).ok(), None);
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
                        if let Ok(first) = ids.assign(true, term, n, FAR) {
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
        assert_eq!(ids.assign(true, 1, 50, FAR).ok(), Some(101));
        // A later term whose store mark is lower (this node's own ids were not applied
        // anywhere yet) keeps the counter where it was.
        assert!(ids.start_confirming(true, 2));
        ids.confirmed(Some((2, 120)));
        assert_eq!(ids.assign(true, 2, 1, FAR).ok(), Some(151));
        assert!(ids.start_confirming(true, 3));
        ids.confirmed(Some((3, 500)));
        assert_eq!(ids.assign(true, 3, 1, FAR).ok(), Some(501));
    }

    #[test]
    fn ids_stay_within_the_window_above_the_applied_mark() {
        let mut ids = Ids::default();
        assert!(ids.start_confirming(true, 1));
        ids.confirmed(Some((1, 100)));
        let w = IDS_UNAPPLIED_MAX;
        assert_eq!(ids.assign(true, 1, w, 100), Ok(101), "up to 100 + w");
        assert_eq!(ids.assign(true, 1, 1, 100), Err(Refused::TooFarAhead));
        assert_eq!(ids.next(), 101 + w, "nothing assigned by a refusal");
        assert_eq!(
            ids.assign(true, 1, 1, 101),
            Ok(101 + w),
            "once one more applied"
        );
        assert_eq!(ids.assign(false, 1, 1, FAR), Err(Refused::NotReady));
    }

    proptest::proptest! {
        /// Issue 26.1: leaders one after another, each confirming over what the ones before it
        /// applied (`ReserveIds` at the mark + the window) and handing out batches, some of
        /// which are applied and some lost (cut by the next leader): no id is handed out twice.
        #[test]
        fn no_id_is_handed_out_twice_across_leaders(
            terms in proptest::collection::vec(
                proptest::collection::vec((1u64..(1 << 22), proptest::bool::ANY), 1..30),
                1..8,
            )
        ) {
            // Ranges handed out, by first id.
            let mut handed: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
            // The committed mark every leader's confirmation sees (ids applied or reserved).
            let mut committed = 0u64;
            for (t, batches) in terms.into_iter().enumerate() {
                let term = t as u64 + 1;
                // Each term on a new node: its own counter starts from nothing.
                let mut ids = Ids::default();
                proptest::prop_assert!(ids.start_confirming(true, term));
                let floor = committed + IDS_UNAPPLIED_MAX;
                committed = floor;
                ids.confirmed(Some((term, floor)));
                let mut applied = floor;
                for (n, commits) in batches {
                    let Ok(first) = ids.assign(true, term, n, applied) else {
                        // Full window: what is in flight must apply first; this leader ends.
                        break;
                    };
                    let last = first + n - 1;
                    let before = handed.range(..=last).next_back();
                    proptest::prop_assert!(
                        before.is_none_or(|(_, &end)| end < first),
                        "ids {}..={} overlap {:?}", first, last, before
                    );
                    handed.insert(first, last);
                    if commits {
                        // Applied here, and committed for the next leader (entries commit in
                        // order: what was lost before it is not in any log).
                        applied = first + n - 1;
                        committed = committed.max(applied);
                    }
                }
            }
        }
    }
}
