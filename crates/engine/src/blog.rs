//! The backup log (b-log): one per server, fed by the Rowan receiver, digested into
//! the shards' indexes (seed 000 §4.3, §4.4).
//!
//! Control role (`control_step`): keeps `posted_segments` free segments posted to the
//! Rowan receiver (allocated as *using*, owner control, in address order, in
//! batches); each step asks the receiver which buffers the NIC has moved past and
//! whose grace period has passed, marks those segments *used* and queues them for
//! digest, in landing order. It never polls a completion queue.
//!
//! Digest roles (`digest_step(d)`): `digest_count` of them, digest `d` owning the
//! shards with `shard % digest_count == d`. Each parses every used segment in order,
//! installs its own shards' entries (version-conditionally: versions decide races
//! with the cleaner and with other writers), assembles multi-block entries whose
//! blocks landed apart, records the segment's MaxVer per shard, and applies the
//! ⟨shard, CommitVer⟩ records it meets to the shared CommitVer array.
//!
//! Commit (`try_commit`): a used segment every digest has parsed becomes *committed*
//! when, for every shard, its MaxVer ≤ CommitVer — all its entries are durable on
//! every replica — and only then may the cleaner collect it.
//!
//! A *passive* backup log (`passive`) has no receiver: the WRITE strategies' backups
//! hand it segments their senders sealed (`enqueue_sealed`, used after the same
//! grace period) and RPC backups their full per-thread b-log segments
//! (`enqueue_used`); digest and commit are the same for all. `digest_now` digests
//! one segment whatever its state, for a quiescent backup.
//!
//! After a restart, recovery has already indexed every segment. A replica's
//! recovery (`Engine::open_replica`) leaves every log segment that was not
//! committed *used* — Rowan b-log, per-thread b-log and t-log segments alike — and
//! `assemble` queues them for digest in allocation order, so they are committed
//! only once their shards' CommitVer passes them, after the cold start's gather
//! has read them. Rowan b-log segments a standalone engine's recovery left being
//! filled (`Engine::open`) are committed: there is no replica to agree with.
//! A primary raises the CommitVer of the shards it serves itself
//! (`note_commit_version`): its own logs hold their entries too.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_fabric::{Access, MemoryRegion, Nic, QpAddr, QueuePair, RegionMemory};
use rowankv_rowan::{ReceiverConfig, RowanReceiver};
use rowankv_types::{NodeId, SegmentId, ShardId, Version};

use crate::engine::Ingested;
use crate::entry::Assembler;
use crate::segment::{Owner, SegmentState};
use crate::{Engine, EngineError};

/// Register `engine`'s data area (every segment) with `nic` for remote writes:
/// where a NIC lands what primaries replicate, by Rowan into the b-log or by
/// WRITE into granted segments. Offsets in the region are data-area offsets.
pub fn register_data_area<N: Nic>(engine: &Engine, nic: &N) -> Result<MemoryRegion, EngineError> {
    let layout = engine.layout();
    let memory: Arc<dyn RegionMemory> = engine.pool().clone();
    nic.register(
        memory,
        layout.data_offset,
        layout.segment_count * layout.segment_size_bytes,
        Access::REMOTE_WRITE,
    )
    .map_err(|e| EngineError::Config(format!("registering the data area: {e}")))
}

/// Configuration of the backup log.
#[derive(Clone, Debug)]
pub struct BackupLogConfig {
    /// Segments kept posted to the receiver (the paper posts 512 of 4 MiB).
    pub posted_segments: usize,
    /// Grace period for DMA still in flight into a consumed segment (§4.3: 2 ms).
    pub grace_ns: u64,
    /// Digest roles; each owns `shard % digest_count`.
    pub digest_count: usize,
    pub ring_cq_entries: usize,
}

impl Default for BackupLogConfig {
    fn default() -> Self {
        BackupLogConfig {
            posted_segments: 16,
            grace_ns: 2_000_000,
            digest_count: 2,
            ring_cq_entries: 4096,
        }
    }
}

struct UsedSegment {
    /// Position in landing order.
    pos: u64,
    seg: SegmentId,
    max_ver: BTreeMap<u16, u64>,
    digested_by: usize,
    /// Entries whose blocks a digest role had not all seen when it finished
    /// this segment (some of them may lie here): the segment is not committed
    /// while any is incomplete, whatever its MaxVer — committed, it would
    /// leave the walks that gather uncommitted entries (a promotion, a cold
    /// start), which could then not assemble the entry. Cleared as the digest
    /// completes them in later segments.
    incomplete: Vec<(ShardId, Version)>,
}

struct DigestCursor {
    next_pos: u64,
    assembler: Assembler,
}

/// What one control step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlReport {
    pub segments_used: usize,
    pub segments_posted: usize,
}

/// One server's backup log.
pub struct BackupLog<N: Nic> {
    engine: Arc<Engine>,
    config: BackupLogConfig,
    /// `None`: a passive backup log, fed by remote WRITE logs and per-thread b-logs
    /// (the baselines' replication) rather than by a Rowan receiver.
    receiver: Option<Mutex<RowanReceiver<N>>>,
    /// This server's ends of the queue pairs remote senders WRITE into its
    /// granted segments with (the WRITE strategies), until `disconnect`, with
    /// the key their sender gave.
    writers: Mutex<Vec<(Option<u16>, N::Qp)>>,
    /// Segments a remote sender sealed, waiting out the grace period for its WRITEs
    /// still in flight: (sealed at, segment).
    sealed: Mutex<VecDeque<(u64, SegmentId)>>,
    used: Mutex<(VecDeque<UsedSegment>, u64)>,
    digests: Vec<Mutex<DigestCursor>>,
    commit_ver: Vec<AtomicU64>,
}

impl<N: Nic> BackupLog<N> {
    /// Register the pool's data area with `nic`, start the Rowan receiver and post
    /// the first batch of segments.
    pub fn start(
        engine: Arc<Engine>,
        nic: N,
        config: BackupLogConfig,
    ) -> Result<Self, EngineError> {
        if config.digest_count == 0 || config.posted_segments == 0 {
            return Err(EngineError::Config(
                "digest_count and posted_segments must be positive".into(),
            ));
        }
        let layout = *engine.layout();
        let region = register_data_area(&engine, &nic)?;
        let receiver = Some(
            RowanReceiver::new(
                nic,
                region,
                ReceiverConfig {
                    buffer_bytes: layout.segment_size_bytes,
                    posted_max: config.posted_segments,
                    grace_ns: config.grace_ns,
                    ring_cq_entries: config.ring_cq_entries,
                    ..ReceiverConfig::default()
                },
            )
            .map_err(|e| EngineError::Config(format!("Rowan receiver: {e}")))?,
        );
        let log = Self::assemble(engine, config, receiver)?;
        log.replenish()?;
        Ok(log)
    }

    /// A backup log without a Rowan receiver: segments reach it through
    /// [`BackupLog::enqueue_sealed`] and [`BackupLog::enqueue_used`].
    pub fn passive(engine: Arc<Engine>, config: BackupLogConfig) -> Result<Self, EngineError> {
        if config.digest_count == 0 {
            return Err(EngineError::Config("digest_count must be positive".into()));
        }
        Self::assemble(engine, config, None)
    }

    fn assemble(
        engine: Arc<Engine>,
        config: BackupLogConfig,
        receiver: Option<RowanReceiver<N>>,
    ) -> Result<Self, EngineError> {
        let layout = *engine.layout();
        // Segments of an earlier run were indexed by recovery: see the module doc.
        // Those a replica's recovery left used wait for digest and commit like any
        // used segment, in allocation order (the order blocks landed in).
        let segments = engine.segments();
        let mut recovered_used: Vec<(u64, SegmentId)> = Vec::new();
        for i in 0..layout.segment_count as u32 {
            let seg = SegmentId(i);
            if let Ok(m) = segments.meta(seg) {
                let log = matches!(m.owner, Owner::Control | Owner::Backup | Owner::Worker);
                if log && m.state == SegmentState::Used {
                    recovered_used.push((m.seq, seg));
                } else if m.owner == Owner::Control && m.state == SegmentState::Using {
                    segments.transition(seg, SegmentState::Committed);
                }
            }
        }
        recovered_used.sort_unstable();
        let queue: VecDeque<UsedSegment> = recovered_used
            .iter()
            .enumerate()
            .map(|(pos, &(_, seg))| UsedSegment {
                pos: pos as u64,
                seg,
                max_ver: BTreeMap::new(),
                digested_by: 0,
                incomplete: Vec::new(),
            })
            .collect();
        let queued = queue.len() as u64;
        let shards = engine.config().shard_count as usize;
        Ok(BackupLog {
            receiver: receiver.map(Mutex::new),
            writers: Mutex::new(Vec::new()),
            sealed: Mutex::new(VecDeque::new()),
            used: Mutex::new((queue, queued)),
            digests: (0..config.digest_count)
                .map(|_| {
                    Mutex::new(DigestCursor {
                        next_pos: 0,
                        assembler: Assembler::new(),
                    })
                })
                .collect(),
            commit_ver: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            engine,
            config,
        })
    }

    /// Give a sender a queue pair on the b-log's receive queue.
    pub fn accept(&self, sender: QpAddr) -> Result<QpAddr, EngineError> {
        self.receiver
            .as_ref()
            .ok_or(EngineError::Config(
                "a passive backup log has no receiver".into(),
            ))?
            .lock()
            .accept(sender)
            .map_err(|e| EngineError::Config(format!("accepting a sender: {e}")))
    }

    /// As [`Self::accept`], for the sender known on its node as `key` (a
    /// worker): the queue pair accepted before for the same node and key is
    /// closed (`rowankv_rowan::RowanReceiver::accept_as`).
    pub fn accept_as(&self, sender: QpAddr, key: u16) -> Result<QpAddr, EngineError> {
        self.receiver
            .as_ref()
            .ok_or(EngineError::Config(
                "a passive backup log has no receiver".into(),
            ))?
            .lock()
            .accept_as(sender, key)
            .map_err(|e| EngineError::Config(format!("accepting a sender: {e}")))
    }

    /// Keep `qp`, this server's end of a connection a remote sender WRITEs into
    /// granted segments through (connected already), so that [`Self::disconnect`]
    /// can destroy it.
    pub fn accept_writer(&self, qp: N::Qp) {
        self.writers.lock().push((None, qp));
    }

    /// As [`Self::accept_writer`], for the sender's queue pair known on its node
    /// as `key`: the one kept before for the same node and key is closed.
    pub fn accept_writer_as(&self, qp: N::Qp, key: u16) {
        let node = qp.peer().map(|p| p.node);
        let mut writers = self.writers.lock();
        writers.retain(|(k, old)| {
            let same = *k == Some(key) && node.is_some() && old.peer().map(|p| p.node) == node;
            if same {
                old.close();
            }
            !same
        });
        writers.push((Some(key), qp));
    }

    /// Destroy the queue pairs from `node` (removed from the configuration) —
    /// the receiver's and the remote writers' — as RDMA fences a sender: its
    /// replication SENDs and WRITEs fail from now on and never land, those a
    /// link delay still holds included. Returns how many were closed.
    pub fn disconnect(&self, node: NodeId) -> usize {
        let received = self
            .receiver
            .as_ref()
            .map_or(0, |r| r.lock().disconnect(node));
        let mut writers = self.writers.lock();
        let before = writers.len();
        writers.retain(|(_, qp)| {
            let from_node = qp.peer().is_some_and(|p| p.node == node);
            if from_node {
                qp.close();
            }
            !from_node
        });
        received + before - writers.len()
    }

    fn replenish(&self) -> Result<usize, EngineError> {
        let layout = *self.engine.layout();
        let segments = self.engine.segments();
        let Some(receiver) = &self.receiver else {
            return Ok(0);
        };
        let mut receiver = receiver.lock();
        let mut batch = Vec::new();
        while receiver.posted_count() + batch.len() < self.config.posted_segments {
            let Some(seg) = segments.alloc(Owner::Control, 0) else {
                break;
            };
            batch.push(layout.segment_offset(seg) - layout.data_offset);
        }
        if !batch.is_empty() {
            receiver
                .post(&batch)
                .map_err(|e| EngineError::Config(format!("posting b-log segments: {e}")))?;
        }
        Ok(batch.len())
    }

    /// One step of the control role at time `now_ns`.
    pub fn control_step(&self, now_ns: u64) -> Result<ControlReport, EngineError> {
        let layout = *self.engine.layout();
        let mut used: Vec<SegmentId> = match &self.receiver {
            Some(r) => r
                .lock()
                .tick(now_ns)
                .into_iter()
                .map(|offset| {
                    layout
                        .segment_of(layout.data_offset + offset)
                        .expect("posted buffers are segments")
                })
                .collect(),
            None => Vec::new(),
        };
        {
            let mut sealed = self.sealed.lock();
            while sealed
                .front()
                .is_some_and(|&(at, _)| now_ns >= at.saturating_add(self.config.grace_ns))
            {
                used.push(sealed.pop_front().expect("checked").1);
            }
        }
        {
            let mut q = self.used.lock();
            for &seg in &used {
                self.engine.segments().transition(seg, SegmentState::Used);
                let pos = q.1;
                q.1 += 1;
                q.0.push_back(UsedSegment {
                    pos,
                    seg,
                    max_ver: BTreeMap::new(),
                    digested_by: 0,
                    incomplete: Vec::new(),
                });
            }
        }
        let posted = self.replenish()?;
        Ok(ControlReport {
            segments_used: used.len(),
            segments_posted: posted,
        })
    }

    /// A segment a remote sender filled with one-sided WRITEs and will not write
    /// again: it becomes *used* once the grace period for WRITEs still in flight
    /// has passed (a later `control_step`).
    pub fn enqueue_sealed(&self, seg: SegmentId, now_ns: u64) {
        self.sealed.lock().push_back((now_ns, seg));
    }

    /// A segment whose every entry is already durable (a per-thread b-log's full
    /// segment): *used* at once, queued for digest.
    pub fn enqueue_used(&self, seg: SegmentId) {
        self.engine.segments().transition(seg, SegmentState::Used);
        let mut q = self.used.lock();
        let pos = q.1;
        q.1 += 1;
        q.0.push_back(UsedSegment {
            pos,
            seg,
            max_ver: BTreeMap::new(),
            digested_by: 0,
            incomplete: Vec::new(),
        });
    }

    /// Digest `seg` now for every shard, whatever its state: for a quiescent
    /// backup (tests, shutdown), segments still being filled. Idempotent: index
    /// updates are version-conditional. Returns the blocks it skipped.
    pub fn digest_now(&self, seg: SegmentId) -> Result<usize, EngineError> {
        let mut assembler = Assembler::new();
        let commit_ver = &self.commit_ver;
        let mut sink = |i: Ingested| {
            if let Ingested::Commit { shard, version } = i {
                if let Some(c) = commit_ver.get(shard.0 as usize) {
                    c.fetch_max(version.0, Ordering::AcqRel);
                }
            }
        };
        Ok(self
            .engine
            .ingest_segment(seg, &|_| true, &mut assembler, &mut sink)?
            .len())
    }

    /// Segments posted to the receiver that the NIC has started filling (first
    /// word set), in posting order.
    pub fn receiver_heads(&self) -> Vec<SegmentId> {
        let Some(r) = &self.receiver else {
            return Vec::new();
        };
        let layout = *self.engine.layout();
        let r = r.lock();
        r.posted()
            .filter(|&offset| self.engine.pool().read_u64(layout.data_offset + offset) != 0)
            .filter_map(|offset| layout.segment_of(layout.data_offset + offset))
            .collect()
    }

    /// Segments sealed by remote senders, still in their grace period.
    pub fn sealed_segments(&self) -> Vec<SegmentId> {
        self.sealed.lock().iter().map(|&(_, s)| s).collect()
    }

    /// One step of digest role `d`: parse every used segment it has not parsed yet.
    /// Returns the number of segments parsed.
    pub fn digest_step(&self, d: usize) -> Result<usize, EngineError> {
        assert!(d < self.config.digest_count);
        let count = self.config.digest_count;
        let mut cursor = self.digests[d].lock();
        let todo: Vec<(u64, SegmentId)> = self
            .used
            .lock()
            .0
            .iter()
            .filter(|u| u.pos >= cursor.next_pos)
            .map(|u| (u.pos, u.seg))
            .collect();
        let owns = |s: ShardId| s.0 as usize % count == d;
        for &(pos, seg) in &todo {
            let mut max_ver: BTreeMap<u16, u64> = BTreeMap::new();
            let mut completed: Vec<(ShardId, Version)> = Vec::new();
            let commit_ver = &self.commit_ver;
            let mut sink = |i: Ingested| match i {
                Ingested::Entry { shard, version, .. } => {
                    let m = max_ver.entry(shard.0).or_default();
                    *m = (*m).max(version.0);
                    completed.push((shard, version));
                }
                Ingested::Commit { shard, version } => {
                    if let Some(c) = commit_ver.get(shard.0 as usize) {
                        c.fetch_max(version.0, Ordering::AcqRel);
                    }
                }
            };
            // Blocks that do not verify are skipped (recovery reports them).
            self.engine
                .ingest_segment(seg, &owns, &mut cursor.assembler, &mut sink)?;
            let mut q = self.used.lock();
            if !completed.is_empty() {
                for u in q.0.iter_mut().filter(|u| !u.incomplete.is_empty()) {
                    u.incomplete.retain(|id| !completed.contains(id));
                }
            }
            if let Some(u) = q.0.iter_mut().find(|u| u.pos == pos) {
                for (s, v) in max_ver {
                    let m = u.max_ver.entry(s).or_default();
                    *m = (*m).max(v);
                }
                u.incomplete.extend(cursor.assembler.pending_ids());
                u.digested_by += 1;
            }
            cursor.next_pos = pos + 1;
        }
        Ok(todo.len())
    }

    /// Move every fully digested used segment whose MaxVer ≤ CommitVer for every
    /// shard to committed. Returns how many moved.
    pub fn try_commit(&self) -> usize {
        let mut q = self.used.lock();
        let count = self.config.digest_count;
        let mut moved = 0;
        let commit_ver = &self.commit_ver;
        let segments = self.engine.segments();
        q.0.retain(|u| {
            let done = u.digested_by == count
                && u.incomplete.is_empty()
                && u.max_ver.iter().all(|(&s, &v)| {
                    commit_ver
                        .get(s as usize)
                        .is_some_and(|c| v <= c.load(Ordering::Acquire))
                });
            if done {
                segments.transition(u.seg, SegmentState::Committed);
                moved += 1;
            }
            !done
        });
        moved
    }

    /// Raise `shard`'s CommitVer to `version`: this server is the shard's
    /// primary and every version up to `version` is durable on every replica (its
    /// own b-log holds entries of the shards it leads too: installed by a
    /// promotion, or kept from when it was their backup).
    pub fn note_commit_version(&self, shard: ShardId, version: u64) {
        if let Some(c) = self.commit_ver.get(shard.0 as usize) {
            c.fetch_max(version, Ordering::AcqRel);
        }
    }

    /// The CommitVer this server has seen for `shard`.
    pub fn commit_version(&self, shard: ShardId) -> u64 {
        self.commit_ver
            .get(shard.0 as usize)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Used segments not yet committed, oldest first.
    pub fn pending_segments(&self) -> Vec<SegmentId> {
        self.used.lock().0.iter().map(|u| u.seg).collect()
    }
}
