//! The synchronous redb store: one `Store` whose methods live in the module of their job.
//!
//! - [`schema`]: the tables, their key and value layouts, the digest's row hash.
//! - [`db`]: opening the database, the `Store` handle, commits that publish the digest.
//! - [`tables`]: every change to the data tables, keeping the digest and the topic counts.
//! - [`apply`]: the deterministic apply of log entries.
//! - [`install`]: taking and installing snapshots.
//! - [`scan`]: due-range scans and expiry lookups (the dispatcher's reads).
//! - [`admin`]: reads for the API and tools (topics, peek, groups, counts).
//!
//! Tables:
//!
//! | table | key | value |
//! |---|---|---|
//! | `messages` | 24-byte event key | encoded [`futureq_core::StoredMessage`] |
//! | `indexes` | index key ([`futureq_core::IndexValue::index_key`]) · event key | () |
//! | `expiry` | expires-at (u64 BE ms) · event key | () |
//! | `meta` | name | u64 (`last-id`, `digest`, applied log id) |
//! | `groups` | topic hash (u64 BE) · group name | () |
//! | `topics` | topic hash (u64 BE) | [`TopicRow`]: stored (u64 LE) · dead-lettered (u64 LE) · name |
//! | `dedup` | topic hash (u64 BE) · dedup id | key of the message stored first (24) · until (i64 LE ms) |
//! | `dedup-sweep` | until (u64 BE ms) · event id (u64 BE) | the `dedup` keys one store command remembered, each u32 LE length · key |
//!
//! A message with a dedup id ([`futureq_core::Extras`]) is stored only when its
//! `(topic, dedup id)` has no `dedup` row whose until lies after the message's enqueue time;
//! otherwise the apply answers the first message's key. Rows past their until are removed by
//! later store commands with dedup ids and by dead letters: a store command lists the rows it
//! remembered in `dedup-sweep` rows of at most 64 keys (each keyed by the latest until among
//! the command's rows and the event id of the first message it lists); each then forgets the
//! rows of lists, oldest first, whose until lies `DEDUP_CLOCK_SKEW_MAX_MS` before its own
//! clock: exactly twice the rows it listed (at least 8), or fewer when no more are due; a list
//! cut there keeps its rest, so one command's work is bounded whatever the lists' sizes. A
//! listed row remembered again since (a later until) stays for its later list. One list row
//! per 64 ids of a command, not one index row per id: an id costs one B-tree insert when it
//! is new (issue 29.4; a duplicate costs two, the row put
//! back). Every decision reads only the entry and the applied state: replicas agree. A list
//! that is not whole fails the apply (`CorruptMeta`) and a snapshot that holds one.
//! A store of the earlier version (a `dedup-expiry` row per id) is listed once at open, one
//! list per row; so replicas upgraded at different log indexes list the same rows differently
//! until the lists of the ids remembered before the upgrade are swept: different digests, and
//! they may forget such an id at different commands. Only a message whose enqueue time lies
//! over `DEDUP_CLOCK_SKEW_MAX_MS` behind the clock that swept its id's row can then be stored
//! on one replica and deduplicated on another; upgrade the nodes in one go (or with no
//! publishes from clocks a minute behind) to rule that out.
//!
//! `topics` holds per topic the exact number of rows in `messages` (kept by every write that
//! adds or removes one, in the same transaction) and the dead letters moved out of it since
//! the store was created; a topic's row exists while either is non-zero. A store written
//! before the table existed is counted once at open.
//!
//! The **digest** is the XOR of one hash per row of `messages`, `indexes`, `expiry`,
//! `groups`, `topics`, `dedup` and `dedup-sweep`: a function of the stored state alone, whatever the order of the writes that led
//! to it, kept in `meta` by every transaction that changes those tables. Replicas that applied
//! the same log have the same digest ([`Store::digest`]).
//!
//! Every method is blocking: call them only off the executors (the write core's blocking
//! threads, the reader and admin threads in [`crate::service`]).

mod admin;
mod apply;
mod db;
mod install;
mod scan;
pub(crate) mod schema;
mod tables;

pub use admin::{TopicCounts, TopicStat};
pub use apply::{ApplyOutcome, Refusal};
pub use db::{ApplyStats, Store, StoreMode};
pub use schema::{TopicRow, DEDUP_CLOCK_SKEW_MAX_MS};
