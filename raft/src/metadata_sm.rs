//! The metadata group's openraft state machine: the in-memory [`MetaState`] (topology and
//! address registry), rebuilt from the log or a snapshot at start. Its state is tiny, so
//! snapshots are taken often and are a plain copy.
//!
//! An undecodable command is logged and skipped (the group must not stop on one bad
//! proposal); every replica skips it alike.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;

use futureq_core::metadata::{MetaCommand, MetaState};
use futures::StreamExt;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, StoredMembership};

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::codec::{decode_snapshot_meta, encode_snapshot_meta, RaftLogId, RaftMembership};
use crate::state_machine::{EventSnapshot, Meta};
use crate::types::{Applied, SnapshotData, TypeConfig};

/// Largest metadata snapshot received or installed (the state is a few KB; a larger one is
/// refused).
pub const META_SNAPSHOT_MAX: u64 = 64 << 20;

/// The last snapshot the state machine built or installed, kept for `get_current_snapshot`.
#[derive(Clone, Default)]
struct CurrentSnapshot(Rc<RefCell<Option<(Meta, Bytes)>>>);

impl CurrentSnapshot {
    /// Remembers a snapshot and returns it.
    fn set(&self, meta: Meta, data: Bytes) -> EventSnapshot {
        *self.0.borrow_mut() = Some((meta.clone(), data.clone()));
        openraft::storage::Snapshot {
            meta,
            snapshot: SnapshotData::from_bytes(data),
        }
    }

    /// The remembered snapshot.
    fn get(&self) -> Option<EventSnapshot> {
        self.0
            .borrow()
            .clone()
            .map(|(meta, data)| openraft::storage::Snapshot {
                meta,
                snapshot: SnapshotData::from_bytes(data),
            })
    }
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

#[derive(Default)]
struct Inner {
    state: MetaState,
    applied: Option<RaftLogId>,
    membership: RaftMembership,
}

/// The metadata state machine (cheap to clone; clones share the state).
///
/// With a directory, every snapshot it builds or installs is also written there (durably,
/// before the log behind it may be purged) and loaded again at start: the state is in memory
/// only, so the snapshot file plus the log are what rebuild it.
#[derive(Clone, Default)]
pub struct MetaStateMachine(Rc<RefCell<Inner>>, CurrentSnapshot, Option<PathBuf>);

/// File name of the persisted metadata snapshot.
pub const SNAPSHOT_FILE: &str = "snapshot";

/// Writes `bytes` to `dir/name` atomically and durably (temp file, fsync, rename, fsync dir).
fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

impl MetaStateMachine {
    /// A state machine that persists its snapshots in `dir` and starts from the one found
    /// there.
    ///
    /// # Errors
    /// The snapshot file cannot be read or does not decode.
    pub fn open(dir: PathBuf) -> io::Result<Self> {
        let sm = MetaStateMachine(Rc::default(), CurrentSnapshot::default(), Some(dir.clone()));
        match std::fs::read(dir.join(SNAPSHOT_FILE)) {
            Ok(bytes) => {
                let (meta, data) = decode_snapshot_meta(&bytes).map_err(io_err)?;
                sm.restore(&meta, data.to_vec())?;
                tracing::info!(target: "raft.metadata", last_log_id = %meta.last_log_id.map_or_else(|| "none".to_owned(), |l| l.to_string()), "metadata restored from its snapshot");
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(sm)
    }

    fn restore(&self, meta: &Meta, data: impl Into<Bytes> + AsRef<[u8]>) -> io::Result<()> {
        let state = MetaState::restore(data.as_ref()).map_err(io_err)?;
        let mut inner = self.0.borrow_mut();
        inner.state = state;
        inner.applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        self.1.set(meta.clone(), data.into());
        Ok(())
    }

    /// Persists a snapshot (when this machine has a directory), off the reactor.
    async fn persist(&self, meta: &Meta, data: &[u8]) -> io::Result<()> {
        let Some(dir) = self.2.clone() else {
            return Ok(());
        };
        let bytes = encode_snapshot_meta(meta, data);
        glommio::executor()
            .spawn_blocking(move || write_durably(&dir, SNAPSHOT_FILE, &bytes))
            .await
    }

    /// A copy of the current metadata (what `GetClusterInfo` answers from).
    #[must_use]
    pub fn state(&self) -> MetaState {
        self.0.borrow().state.clone()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for MetaStateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<EventSnapshot, io::Error> {
        let (meta, data) = {
            let inner = self.0.borrow();
            let meta = Meta {
                last_log_id: inner.applied,
                last_membership: inner.membership.clone(),
            };
            (meta, inner.state.snapshot())
        };
        // Durable before openraft may purge the log behind it.
        self.persist(&meta, &data).await?;
        Ok(self.1.set(meta, data.into()))
    }
}

impl RaftStateMachine<TypeConfig> for MetaStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<RaftLogId>, RaftMembership), io::Error> {
        let inner = self.0.borrow();
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            {
                let mut inner = self.0.borrow_mut();
                inner.applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Normal(c) => match MetaCommand::decode(&c.0) {
                        Ok(cmd) => {
                            inner.state.apply(cmd);
                        }
                        Err(e) => {
                            tracing::warn!(target: "raft.metadata", index = entry.log_id.index, error = %e, "skipping undecodable metadata command");
                        }
                    },
                    EntryPayload::Membership(m) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), m)
                    }
                    EntryPayload::Blank => {}
                }
            }
            if let Some(r) = responder {
                r.send(Applied::Done(futureq_core::command::Answer::None));
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Self::SnapshotData,
    ) -> Result<(), io::Error> {
        let data = snapshot.read_all(META_SNAPSHOT_MAX).await?;
        // Validate before anything changes, persist, then switch.
        MetaState::restore(&data).map_err(io_err)?;
        self.persist(meta, &data).await?;
        self.restore(meta, data)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<EventSnapshot>, io::Error> {
        Ok(self.1.get())
    }
}
