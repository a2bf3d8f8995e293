//! The metadata server (MS): the one part of Clover with a CPU of its own.
//!
//! It owns, in its DRAM:
//! - the **index**: key bytes → key id (unique, never reused), chain head and a
//!   tail **hint**; a key's chain starts with an "absent" head version the MS
//!   writes, persisted, to every replica when the key is created;
//! - **space**: the slots of the memory nodes (the same offset on every replica),
//!   each with its generation; clients take slots in **chunks**
//!   ([`MetadataServer::alloc_chunk`]) and write versions into them without asking
//!   again;
//! - **garbage collection** ([`MetadataServer::gc`]): it walks a chain on the
//!   primary with one-sided READs, drains the primary (so every link it saw is
//!   durable), keeps the newest `versions_kept` versions, frees the older ones
//!   (bumping their generation) and moves the head and the hint forward. It frees
//!   only a prefix of versions whose writers have reported them: a writer still
//!   resolving an unknown outcome walks from the head to find its version.
//!
//! Hints are lazy, as in Clover: a client reports its version after the write was
//! acknowledged ([`MetadataServer::report`]), and the MS keeps the hint only while
//! the slot is live, so a hint always names a live version of the key (possibly not
//! the tail: clients walk from it).
//!
//! The MS is assumed not to crash (Clover makes the same assumption of its
//! metadata server's availability; making it fault tolerant is not in seed 004).
//! Clients call it directly (one round trip each in the counts; the wire model does
//! not time them).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, DramMemory, Fabric, LocalAddr, MemoryRegion, Nic,
    Op, Placement, QueuePair, WcStatus, WorkRequest,
};

use crate::layout::{self, SlotRef, Word, GEN_MAX, NEXT_AT};
use crate::memnode::{Connection, MemoryNode};
use crate::{CloverError, Config};

/// Bound on polls of a blocking operation of the MS before it gives up.
pub const MS_POLLS_MAX: u64 = 50_000_000;
/// Bound on the keys the MS indexes.
pub const KEYS_MAX: usize = 1 << 22;

/// What a client needs to know of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyMeta {
    pub key_id: u64,
    pub head: SlotRef,
    pub hint: SlotRef,
}

/// Counters of the MS (no model needed to read them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsStats {
    pub lookups: u64,
    pub creates: u64,
    pub chunks: u64,
    pub reports: u64,
    pub gc_runs: u64,
    pub gc_freed: u64,
}

struct State<N: Nic> {
    conns: Vec<Option<Connection<N>>>,
    index: HashMap<Vec<u8>, u64>,
    keys: Vec<KeyMeta>,
    /// Per key: reports since its last GC.
    since_gc: Vec<u64>,
    gens: Vec<u32>,
    /// Per slot: its version's writer has reported it (so it has finished with
    /// it). GC frees only reported versions: a writer still resolving an unknown
    /// outcome must find its version in the chain, not in the free list.
    reported: Vec<bool>,
    free: VecDeque<u64>,
    next_fresh: u64,
    stats: MsStats,
    round: u64,
}

/// The metadata server. See the module documentation.
pub struct MetadataServer<F: Fabric> {
    config: Config,
    nodes: Vec<Arc<MemoryNode<F>>>,
    nic: F::Nic,
    cq: <F::Nic as Nic>::Cq,
    local: MemoryRegion,
    state: Mutex<State<F::Nic>>,
}

impl<F: Fabric> MetadataServer<F> {
    /// An MS for the replica group `nodes` (primary first), on `nic`.
    pub fn new(
        config: Config,
        nic: F::Nic,
        nodes: Vec<Arc<MemoryNode<F>>>,
    ) -> Result<Arc<Self>, CloverError> {
        config.check()?;
        assert_eq!(nodes.len(), config.replicas, "one memory node per replica");
        for n in &nodes {
            assert!(
                n.memory().len_bytes() >= config.region_bytes(),
                "memory node smaller than the configured slots"
            );
        }
        let cq = nic.create_cq(CqKind::Bounded { capacity: 256 })?;
        let local = nic.register(
            Arc::new(DramMemory::new(config.slot_bytes() + 64)),
            0,
            config.slot_bytes() + 64,
            Access::ALL,
        )?;
        let conns = (0..nodes.len()).map(|_| None).collect();
        Ok(Arc::new(MetadataServer {
            state: Mutex::new(State {
                conns,
                index: HashMap::new(),
                keys: Vec::new(),
                since_gc: Vec::new(),
                gens: vec![0; config.slots],
                reported: vec![false; config.slots],
                free: VecDeque::new(),
                next_fresh: 1,
                stats: MsStats::default(),
                round: 0,
            }),
            config,
            nodes,
            nic,
            cq,
            local,
        }))
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> MsStats {
        self.state.lock().stats
    }

    /// The key's metadata, if it was ever created.
    pub fn lookup(&self, key: &[u8]) -> Option<KeyMeta> {
        let mut s = self.state.lock();
        s.stats.lookups += 1;
        let id = *s.index.get(key)?;
        Some(s.keys[id as usize - 1])
    }

    /// Current head and hint of a key id.
    pub fn meta(&self, key_id: u64) -> KeyMeta {
        let s = self.state.lock();
        assert!(
            key_id >= 1 && key_id as usize <= s.keys.len(),
            "unknown key id"
        );
        s.keys[key_id as usize - 1]
    }

    /// The key's metadata; creates the key (its absent head version persisted on
    /// every replica) on first use.
    pub fn lookup_or_create(&self, key: &[u8]) -> Result<KeyMeta, CloverError> {
        let mut s = self.state.lock();
        s.stats.lookups += 1;
        if let Some(&id) = s.index.get(key) {
            return Ok(s.keys[id as usize - 1]);
        }
        if s.keys.len() >= KEYS_MAX {
            return Err(CloverError::Limit("keys indexed by the metadata server"));
        }
        let slot = self.take_slot(&mut s)?;
        let key_id = s.keys.len() as u64 + 1;
        let mut bytes = layout::encode(slot, key_id, true, &[]);
        // The head has no inbound link: it is durable once written.
        bytes[layout::DURABLE_AT..layout::DURABLE_AT + 8]
            .copy_from_slice(&slot.durable_word().to_le_bytes());
        for i in 0..self.nodes.len() {
            let r = self.run(&mut s, i, |region| {
                vec![(
                    Op::Write {
                        data: &bytes,
                        remote: region.at(slot.offset),
                        imm: None,
                    },
                    true,
                )]
            });
            if let Err(e) = r {
                s.free
                    .push_front(slot.offset / self.config.slot_bytes() as u64);
                return Err(e);
            }
        }
        let index = (slot.offset / self.config.slot_bytes() as u64) as usize;
        s.reported[index] = true;
        let meta = KeyMeta {
            key_id,
            head: slot,
            hint: slot,
        };
        s.keys.push(meta);
        s.since_gc.push(0);
        s.index.insert(key.to_vec(), key_id);
        s.stats.creates += 1;
        Ok(meta)
    }

    /// A chunk of `chunk_slots` free slots for a client's new versions.
    pub fn alloc_chunk(&self) -> Result<Vec<SlotRef>, CloverError> {
        let mut s = self.state.lock();
        s.stats.chunks += 1;
        let mut chunk = Vec::with_capacity(self.config.chunk_slots);
        for _ in 0..self.config.chunk_slots {
            match self.take_slot(&mut s) {
                Ok(slot) => chunk.push(slot),
                Err(e) if chunk.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(chunk)
    }

    fn take_slot(&self, s: &mut State<F::Nic>) -> Result<SlotRef, CloverError> {
        let index = match s.free.pop_front() {
            Some(i) => i,
            None if (s.next_fresh as usize) < self.config.slots => {
                s.next_fresh += 1;
                s.next_fresh - 1
            }
            None => return Err(CloverError::OutOfSpace),
        };
        let offset = index * self.config.slot_bytes() as u64;
        Ok(SlotRef::new(offset, s.gens[index as usize]))
    }

    /// A client's lazy report of an acknowledged version: it becomes the hint if
    /// its slot is still live. Runs GC on the key every `gc_every_reports` reports
    /// of that key.
    pub fn report(&self, key_id: u64, version: SlotRef) {
        let run_gc = {
            let mut s = self.state.lock();
            s.stats.reports += 1;
            let index = (version.offset / self.config.slot_bytes() as u64) as usize;
            if s.gens[index] == version.gen {
                s.keys[key_id as usize - 1].hint = version;
                s.reported[index] = true;
            }
            let n = &mut s.since_gc[key_id as usize - 1];
            *n += 1;
            let due = self.config.gc_every_reports > 0 && *n >= self.config.gc_every_reports;
            if due {
                *n = 0;
            }
            due
        };
        if run_gc {
            // GC is best effort: a memory node that is down is collected later.
            let _ = self.gc(key_id);
        }
    }

    /// Collect the key's old versions (see the module documentation); returns
    /// how many slots were freed.
    pub fn gc(&self, key_id: u64) -> Result<usize, CloverError> {
        let mut s = self.state.lock();
        s.stats.gc_runs += 1;
        let meta = s.keys[key_id as usize - 1];
        let slot_bytes = self.config.slot_bytes();
        let mut chain = vec![meta.head];
        let mut at = meta.head;
        loop {
            if chain.len() > self.config.walk_steps_max {
                return Err(CloverError::Limit("chain walk of the GC"));
            }
            self.run(&mut s, 0, |region| {
                vec![(
                    Op::Read {
                        remote: region.at(at.offset),
                        len: slot_bytes,
                        local: LocalAddr {
                            mr: &self.local,
                            offset: 0,
                        },
                    },
                    false,
                )]
            })?;
            let mut buf = vec![0u8; slot_bytes];
            self.local.read(0, &mut buf);
            let v = layout::decode(at.offset, &buf).map_err(|e| CloverError::Corrupt {
                offset: at.offset,
                detail: e.to_string(),
            })?;
            if v.gen != at.gen || v.key_id != key_id {
                return Err(CloverError::Corrupt {
                    offset: at.offset,
                    detail: "the MS's chain names a slot of another version".into(),
                });
            }
            match layout::decode_word(v.next) {
                Word::Link(next) => {
                    chain.push(next);
                    at = next;
                }
                _ => break,
            }
        }
        let kept = self.config.versions_kept;
        if chain.len() <= kept {
            return Ok(0);
        }
        // Drain the primary so that every link walked is durable before the
        // versions before it go.
        let len = self.config.region_bytes();
        self.run(&mut s, 0, |region| {
            vec![(
                Op::Flush {
                    remote: region.at(0),
                    len,
                    placement: Placement::Persistence,
                },
                false,
            )]
        })?;
        let index_of = |r: &SlotRef| (r.offset / slot_bytes as u64) as usize;
        let cut = chain[..chain.len() - kept]
            .iter()
            .position(|r| !s.reported[index_of(r)])
            .unwrap_or(chain.len() - kept);
        if cut == 0 {
            return Ok(0);
        }
        for old in &chain[..cut] {
            let index = (old.offset / slot_bytes as u64) as usize;
            assert_eq!(s.gens[index], old.gen, "GC frees a live slot once");
            s.reported[index] = false;
            if s.gens[index] < GEN_MAX {
                s.gens[index] += 1;
                s.free.push_back(index as u64);
            }
        }
        let tail = *chain.last().expect("chain is not empty");
        let m = &mut s.keys[key_id as usize - 1];
        m.head = chain[cut];
        m.hint = tail;
        s.stats.gc_freed += cut as u64;
        Ok(cut)
    }

    /// One blocking round to node `i`: post `ops` (the flag says persist), wait
    /// for every completion.
    fn run<'b>(
        &self,
        s: &mut State<F::Nic>,
        i: usize,
        ops: impl FnOnce(&rowankv_fabric::RemoteRegion) -> Vec<(Op<'b>, bool)>,
    ) -> Result<(), CloverError> {
        let node = &self.nodes[i];
        let up = node.incarnation().ok_or(CloverError::NodeDown(node.id()))?;
        if s.conns[i].as_ref().is_none_or(|c| c.incarnation != up) {
            s.conns[i] = Some(node.connect(&self.nic, &self.cq, 16)?);
        }
        let conn = s.conns[i].as_ref().expect("connected");
        s.round += 1;
        let round = s.round;
        let wrs: Vec<WorkRequest<'b>> = ops(&conn.region)
            .into_iter()
            .map(|(op, persist)| WorkRequest {
                wr_id: round,
                op,
                signaled: true,
                persist,
                sender_flush: false,
            })
            .collect();
        let want = wrs.len();
        if conn.qp.post_send(&wrs).is_err() {
            s.conns[i] = None;
            return Err(CloverError::NodeDown(node.id()));
        }
        let mut got = 0;
        let mut failed = false;
        let mut out = [Completion::BLANK; 16];
        for _ in 0..MS_POLLS_MAX {
            let n = self.cq.poll(&mut out)?;
            for c in &out[..n] {
                if c.wr_id == round {
                    got += 1;
                    failed |= c.status != WcStatus::Success;
                }
            }
            if got == want {
                break;
            }
            std::hint::spin_loop();
        }
        if failed || got != want {
            s.conns[i] = None;
            return Err(CloverError::NodeDown(node.id()));
        }
        Ok(())
    }

    /// The slot offsets of a key's chain on replica `i`, read locally from the
    /// node's memory (for checks: a test's view, not a protocol step).
    pub fn chain_on(&self, i: usize, key_id: u64) -> Result<Vec<(SlotRef, Vec<u8>)>, CloverError> {
        let meta = self.meta(key_id);
        let memory = self.nodes[i].memory();
        let mut out = Vec::new();
        let mut at = meta.head;
        let mut buf = vec![0u8; self.config.slot_bytes()];
        loop {
            if out.len() > self.config.walk_steps_max {
                return Err(CloverError::Limit("chain walk of a check"));
            }
            memory.dma_read(at.offset as usize, &mut buf);
            let v = layout::decode(at.offset, &buf).map_err(|e| CloverError::Corrupt {
                offset: at.offset,
                detail: e.to_string(),
            })?;
            if v.gen != at.gen || v.key_id != key_id {
                return Err(CloverError::Corrupt {
                    offset: at.offset,
                    detail: format!("replica {i}: chain reaches a slot of another version"),
                });
            }
            out.push((at, v.value.clone()));
            match layout::decode_word(v.next) {
                Word::Link(next) => at = next,
                Word::Null(s) if s == at => break,
                _ => {
                    return Err(CloverError::Corrupt {
                        offset: at.offset + NEXT_AT as u64,
                        detail: "bad next word".into(),
                    })
                }
            }
        }
        Ok(out)
    }
}
