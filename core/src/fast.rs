//! Hash maps and sets keyed by event keys, consumer ids and topic hashes, hashed with
//! foldhash instead of the standard SipHash, which took 3–4 % of the dispatcher's samples in
//! a burst of deliveries and ACKs (issue 29). foldhash is seeded per process and per map, and
//! the seed is never exposed; topic hashes come from client-chosen names, but a client cannot
//! see how they land.

use std::collections::{HashMap, HashSet};

/// A map hashed with foldhash (see the module documentation).
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
/// A set hashed like [`FastMap`].
pub(crate) type FastSet<K> = HashSet<K, foldhash::fast::RandomState>;
