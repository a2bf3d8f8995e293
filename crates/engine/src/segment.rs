//! The pool's layout, the segment meta table in PM and the DRAM free list (seed 000
//! §4.2.1, Figure 6).
//!
//! Layout of a pool formatted by the engine (byte-level page: `docs/format/segments.md`):
//! ```text
//! [0, 4096)                 superblock: magic, format, geometry, CRC32C
//! [4096, 4096 + 8 × count)  segment meta table: one 8-byte word per segment
//! [data_offset, ...)        segments, each segment_size_bytes, data_offset 4 KiB aligned
//! ```
//! A meta word is changed only by one 8-byte atomic store followed by a persist, so a
//! crash leaves every word either before or after a transition, never between.
//!
//! Transitions (who may make them):
//! - free → using: allocation (worker t-log, control b-log, cleaner, per-thread
//!   b-log); persisted before the first byte is written into the segment; a b-log
//!   segment (owner control or backup) is zeroed, durably, before that;
//! - using → committed: a t-log segment is full (its entries are on every replica
//!   before they are acknowledged); using → used: a b-log segment the NIC has filled;
//! - used → committed: digest found every shard's MaxVer ≤ CommitVer;
//! - committed → free: the cleaner copied its live entries (persisted) elsewhere.
//!
//! Invariants: a segment is in the DRAM free list iff its word says free; a free
//! segment's bytes are never trusted (recovery does not read them); a segment whose
//! word names owner control or backup holds zeros wherever nothing was written into
//! it since its allocation (`Owner::zeroed_on_alloc`) — no previous occupant's
//! entries, so a walk may go past a zero stride (a hole) to the segment's end.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_pmem::Pool;
use rowankv_types::SegmentId;

use crate::EngineError;

pub const SUPERBLOCK_BYTES: usize = 4096;
pub const META_OFFSET: usize = SUPERBLOCK_BYTES;
const MAGIC: u64 = u64::from_le_bytes(*b"RKVPOOL1");
const FORMAT_VERSION: u32 = 1;
/// Bytes of the superblock covered by its checksum.
const SUPERBLOCK_COVERED: usize = 40;

/// The state of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentState {
    Free = 0,
    Using = 1,
    Used = 2,
    Committed = 3,
}

/// The kind of thread that allocated a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    None = 0,
    Worker = 1,
    Control = 2,
    Cleaner = 3,
    /// A backup's per-thread b-log written by its own CPU (replication by RPC).
    Backup = 4,
}

impl Owner {
    /// Whether a segment allocated for this owner is zeroed (durably) before its
    /// meta word says *using*: the b-logs' segments — Rowan-landed and remote WRITE
    /// logs (`Control`), per-thread b-logs (`Backup`). Digest reads them to a
    /// segment's end and takes every entry's version into the segment's MaxVer, so
    /// it must not meet the previous occupant's entries past the new ones: their
    /// MaxVer (for a shard this server leads, whose CommitVer never reaches it)
    /// would keep the segment from ever being committed. t-log and cleaner segments
    /// are not zeroed (that would be a full media write on the write path): past
    /// their end, recovery may re-index older entries, which versions decide
    /// against.
    pub fn zeroed_on_alloc(self) -> bool {
        matches!(self, Owner::Control | Owner::Backup)
    }
}

/// One decoded meta word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentMeta {
    pub state: SegmentState,
    pub owner: Owner,
    /// Index of the owning thread among its kind (worker id).
    pub owner_index: u8,
    /// Allocation sequence number: orders segments by when they were allocated
    /// (the b-log's order, for digest after recovery). 40 bits.
    pub seq: u64,
}

const SEQ_MAX: u64 = (1 << 40) - 1;

/// Bytes read, and if not all zero written with zeros, at a time when a segment is
/// zeroed on allocation.
const ZEROING_CHUNK_BYTES: usize = 4096;
static ZEROS: [u8; ZEROING_CHUNK_BYTES] = [0; ZEROING_CHUNK_BYTES];

impl SegmentMeta {
    pub const FREE: SegmentMeta = SegmentMeta {
        state: SegmentState::Free,
        owner: Owner::None,
        owner_index: 0,
        seq: 0,
    };

    pub fn encode(&self) -> u64 {
        assert!(self.seq <= SEQ_MAX);
        (self.state as u64)
            | (self.owner as u64) << 8
            | (self.owner_index as u64) << 16
            | self.seq << 24
    }

    /// Decode a word read from PM; an impossible state or owner is an error.
    pub fn decode(word: u64) -> Result<SegmentMeta, String> {
        let state = match word & 0xFF {
            0 => SegmentState::Free,
            1 => SegmentState::Using,
            2 => SegmentState::Used,
            3 => SegmentState::Committed,
            s => return Err(format!("state byte {s}")),
        };
        let owner = match (word >> 8) & 0xFF {
            0 => Owner::None,
            1 => Owner::Worker,
            2 => Owner::Control,
            3 => Owner::Cleaner,
            4 => Owner::Backup,
            o => return Err(format!("owner byte {o}")),
        };
        let meta = SegmentMeta {
            state,
            owner,
            owner_index: ((word >> 16) & 0xFF) as u8,
            seq: word >> 24,
        };
        if (state == SegmentState::Free) != (owner == Owner::None) {
            return Err(format!("state {state:?} with owner {owner:?}"));
        }
        Ok(meta)
    }
}

/// Where things are in a formatted pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub segment_size_bytes: usize,
    pub segment_count: usize,
    pub data_offset: usize,
}

impl Layout {
    /// The largest layout that fits `pool_bytes` with segments of `segment_size_bytes`.
    pub fn for_pool(pool_bytes: usize, segment_size_bytes: usize) -> Result<Layout, EngineError> {
        if segment_size_bytes < 4096 || !segment_size_bytes.is_multiple_of(4096) {
            return Err(EngineError::Config(format!(
                "segment size {segment_size_bytes} B must be a multiple of 4 KiB"
            )));
        }
        // count segments such that META + 8·count rounded to 4 KiB + count·size ≤ pool.
        let mut count = pool_bytes.saturating_sub(SUPERBLOCK_BYTES) / segment_size_bytes;
        while count > 0 && Self::data_offset_for(count) + count * segment_size_bytes > pool_bytes {
            count -= 1;
        }
        if count < 2 {
            return Err(EngineError::Config(format!(
                "a pool of {pool_bytes} B holds fewer than 2 segments of {segment_size_bytes} B"
            )));
        }
        Ok(Layout {
            segment_size_bytes,
            segment_count: count,
            data_offset: Self::data_offset_for(count),
        })
    }

    fn data_offset_for(count: usize) -> usize {
        (META_OFFSET + 8 * count).div_ceil(4096) * 4096
    }

    /// The reserved area of a pool of `pool_bytes` with this layout: offset and
    /// length of everything after the last segment (length 0: none).
    pub fn reserved_area(&self, pool_bytes: usize) -> (usize, usize) {
        let end = self.data_offset + self.segment_count * self.segment_size_bytes;
        (end, pool_bytes.saturating_sub(end))
    }

    pub fn segment_offset(&self, seg: SegmentId) -> usize {
        assert!(
            (seg.0 as usize) < self.segment_count,
            "{seg:?} out of range"
        );
        self.data_offset + seg.0 as usize * self.segment_size_bytes
    }

    /// The segment holding pool offset `addr`, if it is inside the data area.
    pub fn segment_of(&self, addr: usize) -> Option<SegmentId> {
        let rel = addr.checked_sub(self.data_offset)?;
        let seg = rel / self.segment_size_bytes;
        (seg < self.segment_count).then_some(SegmentId(seg as u32))
    }

    fn meta_offset(&self, seg: SegmentId) -> usize {
        META_OFFSET + 8 * seg.0 as usize
    }

    fn encode_superblock(&self) -> [u8; SUPERBLOCK_COVERED + 4] {
        let mut b = [0u8; SUPERBLOCK_COVERED + 4];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&(self.segment_size_bytes as u64).to_le_bytes());
        b[24..32].copy_from_slice(&(self.segment_count as u64).to_le_bytes());
        b[32..40].copy_from_slice(&(self.data_offset as u64).to_le_bytes());
        let crc = crc32c::crc32c(&b[..SUPERBLOCK_COVERED]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Read and check the superblock of `pool`.
    pub fn read(pool: &Pool) -> Result<Layout, EngineError> {
        if pool.len_bytes() < SUPERBLOCK_BYTES {
            return Err(EngineError::Corrupt(
                "pool smaller than a superblock".into(),
            ));
        }
        let mut b = [0u8; SUPERBLOCK_COVERED + 4];
        pool.read(0, &mut b);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u64_at(0) != MAGIC {
            return Err(EngineError::Corrupt(
                "no RowanKV superblock (bad magic)".into(),
            ));
        }
        let stored = u32::from_le_bytes(b[40..44].try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(&b[..SUPERBLOCK_COVERED]);
        if stored != computed {
            return Err(EngineError::Corrupt(format!(
                "superblock checksum mismatch (stored {stored:#x}, computed {computed:#x})"
            )));
        }
        let format = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if format != FORMAT_VERSION {
            return Err(EngineError::Corrupt(format!(
                "unknown pool format {format}"
            )));
        }
        let layout = Layout {
            segment_size_bytes: u64_at(16) as usize,
            segment_count: u64_at(24) as usize,
            data_offset: u64_at(32) as usize,
        };
        let fits = layout.segment_size_bytes >= 4096
            && layout.segment_count >= 2
            && layout.data_offset == Self::data_offset_for(layout.segment_count)
            && layout
                .segment_count
                .checked_mul(layout.segment_size_bytes)
                .and_then(|b| b.checked_add(layout.data_offset))
                .is_some_and(|end| end <= pool.len_bytes());
        if !fits {
            return Err(EngineError::Corrupt(format!(
                "superblock geometry {layout:?} does not fit a pool of {} B",
                pool.len_bytes()
            )));
        }
        Ok(layout)
    }
}

/// The segments of one pool: the meta table in PM and the free list in DRAM.
pub struct Segments {
    pool: Arc<Pool>,
    layout: Layout,
    free: Mutex<VecDeque<SegmentId>>,
    next_seq: AtomicU64,
    /// Reuse the most recently freed segment first (a simulator's choice, to
    /// reuse freed segments at once); by default the least recently freed.
    reuse_newest_first: std::sync::atomic::AtomicBool,
    /// Free segments an allocation leaves, by [`Reach`]: `[ordinary,
    /// maintenance, cleaning]` (replay leaves none). All 0 unless a reserve is
    /// set ([`Segments::set_reserve`]).
    floors: [AtomicUsize; 3],
}

/// Segments of a reserve's headroom only the cleaners may take (they may take
/// the replay part too, [`Reach::Cleaning`]): when everything else is refused,
/// cleaning still makes room.
pub const CLEANING_SEGMENTS: usize = 2;

/// How far into the free segments held in reserve an allocation may reach
/// (`Engine::set_segment_reserve`): the `drpc` strategy's redo rings hold
/// entries already acknowledged, which must always find room in the b-log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// t-logs, Rowan b-logs and remote logs (owners `Worker`, `Control`):
    /// leave the whole reserve free.
    Ordinary,
    /// The per-thread b-logs (`Backup`; under `drpc`, the redo role): may use
    /// the reserve's headroom but the last [`CLEANING_SEGMENTS`] of it.
    Maintenance,
    /// The cleaners (`Cleaner`): every free segment. A cleaner holds one new
    /// segment at a time and frees more than it takes (it cleans segments at
    /// most `clean_live_fraction_max` live), and it must be able to run when
    /// everything else is refused — after the rings' replay used the replay
    /// part, cleaning is what gives it back.
    Cleaning,
    /// The redo rings' replay at recovery: everything.
    Replay,
}

impl Reach {
    pub fn of(owner: Owner) -> Reach {
        match owner {
            Owner::Backup => Reach::Maintenance,
            Owner::Cleaner => Reach::Cleaning,
            _ => Reach::Ordinary,
        }
    }
}

impl Segments {
    /// Format `pool`: superblock and an all-free meta table, persisted; at
    /// least `reserved_tail_bytes` at the pool's end are left out of the
    /// segments (the reserved area, [`Layout::reserved_area`]), its first
    /// 4 KiB zeroed before the superblock is written.
    pub fn format(
        pool: Arc<Pool>,
        segment_size_bytes: usize,
        reserved_tail_bytes: usize,
    ) -> Result<Segments, EngineError> {
        let usable = pool
            .len_bytes()
            .checked_sub(reserved_tail_bytes)
            .ok_or_else(|| {
                EngineError::Config(format!(
                    "a reserved area of {reserved_tail_bytes} B does not fit a pool of {} B",
                    pool.len_bytes()
                ))
            })?;
        let layout = Layout::for_pool(usable, segment_size_bytes)?;
        // The identity goes first: a crash before the superblock is
        // invalidated leaves a pool without an identity, which a server
        // formats (a new server), never an identity over an invalid
        // superblock, which it could neither recover nor trust to format.
        crate::identity::clear_identity(&pool);
        // Then invalidate, so a crash mid-format never leaves a valid
        // superblock over a half-written table.
        pool.write(0, &[0u8; SUPERBLOCK_COVERED + 4]);
        pool.persist(0, SUPERBLOCK_COVERED + 4);
        let table_bytes = 8 * layout.segment_count;
        pool.write(META_OFFSET, &vec![0u8; table_bytes]);
        pool.persist(META_OFFSET, table_bytes);
        let (tail, tail_len) = layout.reserved_area(pool.len_bytes());
        let clear = tail_len.min(4096);
        if clear > 0 {
            pool.write(tail, &vec![0u8; clear]);
            pool.persist(tail, clear);
        }
        pool.write(0, &layout.encode_superblock());
        pool.persist(0, SUPERBLOCK_COVERED + 4);
        Ok(Segments {
            pool,
            free: Mutex::new((0..layout.segment_count as u32).map(SegmentId).collect()),
            layout,
            next_seq: AtomicU64::new(1),
            reuse_newest_first: Default::default(),
            floors: Default::default(),
        })
    }

    /// Open a formatted pool: read the meta table, rebuild the free list. Returns the
    /// segments that are not free (with their meta) and the ones whose word is
    /// corrupt (reported, never used, never freed).
    #[allow(clippy::type_complexity)]
    pub fn open(
        pool: Arc<Pool>,
    ) -> Result<
        (
            Segments,
            Vec<(SegmentId, SegmentMeta)>,
            Vec<(SegmentId, String)>,
        ),
        EngineError,
    > {
        let layout = Layout::read(&pool)?;
        let mut free = VecDeque::new();
        let mut in_use = Vec::new();
        let mut corrupt = Vec::new();
        let mut max_seq = 0;
        for i in 0..layout.segment_count as u32 {
            let seg = SegmentId(i);
            match SegmentMeta::decode(pool.read_u64(layout.meta_offset(seg))) {
                Ok(m) if m.state == SegmentState::Free => free.push_back(seg),
                Ok(m) => {
                    max_seq = max_seq.max(m.seq);
                    in_use.push((seg, m));
                }
                Err(why) => corrupt.push((seg, why)),
            }
        }
        Ok((
            Segments {
                pool,
                layout,
                free: Mutex::new(free),
                next_seq: AtomicU64::new(max_seq + 1),
                reuse_newest_first: Default::default(),
                floors: Default::default(),
            },
            in_use,
            corrupt,
        ))
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn free_count(&self) -> usize {
        self.free.lock().len()
    }

    fn store(&self, seg: SegmentId, meta: SegmentMeta) {
        let at = self.layout.meta_offset(seg);
        self.pool.write_u64(at, meta.encode());
        self.pool.persist(at, 8);
    }

    /// The meta word of `seg` as stored.
    pub fn meta(&self, seg: SegmentId) -> Result<SegmentMeta, String> {
        SegmentMeta::decode(self.pool.read_u64(self.layout.meta_offset(seg)))
    }

    /// Hold free segments back: ordinary allocations leave `replay + headroom`
    /// free, maintenance ones `replay + CLEANING_SEGMENTS`, cleaning and
    /// replay ones none ([`Reach`]). `headroom` is at least
    /// `CLEANING_SEGMENTS + 1`.
    pub fn set_reserve(&self, replay: usize, headroom: usize) {
        let headroom = headroom.max(CLEANING_SEGMENTS + 1);
        self.floors[0].store(replay + headroom, Ordering::Relaxed);
        self.floors[1].store(replay + CLEANING_SEGMENTS, Ordering::Relaxed);
        self.floors[2].store(0, Ordering::Relaxed);
    }

    /// The free segments ordinary, maintenance and cleaning allocations leave.
    pub fn floors(&self) -> [usize; 3] {
        [0, 1, 2].map(|i| self.floors[i].load(Ordering::Relaxed))
    }

    /// Allocate a free segment for `owner`, reaching as far into the reserve as
    /// its [`Reach`]; its *using* state is durable on return.
    /// A segment for an owner that `zeroed_on_alloc` is all zeros, durably, before
    /// its meta word changes (a crash in between leaves it free).
    pub fn alloc(&self, owner: Owner, owner_index: u8) -> Option<SegmentId> {
        self.alloc_reaching(owner, owner_index, Reach::of(owner))
    }

    /// [`Segments::alloc`], reaching as far as `reach`.
    pub fn alloc_reaching(&self, owner: Owner, owner_index: u8, reach: Reach) -> Option<SegmentId> {
        assert!(owner != Owner::None);
        let floor = match reach {
            Reach::Ordinary => self.floors[0].load(Ordering::Relaxed),
            Reach::Maintenance => self.floors[1].load(Ordering::Relaxed),
            Reach::Cleaning => self.floors[2].load(Ordering::Relaxed),
            Reach::Replay => 0,
        };
        let seg = {
            let mut free = self.free.lock();
            if free.len() <= floor {
                return None;
            }
            free.pop_front()?
        };
        if owner.zeroed_on_alloc() {
            self.zero(seg);
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        self.store(
            seg,
            SegmentMeta {
                state: SegmentState::Using,
                owner,
                owner_index,
                seq,
            },
        );
        Some(seg)
    }

    /// Zero `seg` durably: non-temporal stores of the chunks that are not zero
    /// already (a never-used segment of a fresh pool costs reads only), one drain.
    fn zero(&self, seg: SegmentId) {
        let base = self.layout.segment_offset(seg);
        let size = self.layout.segment_size_bytes;
        let mut chunk = [0u8; ZEROING_CHUNK_BYTES];
        for at in (base..base + size).step_by(ZEROING_CHUNK_BYTES) {
            self.pool.read(at, &mut chunk);
            if chunk != ZEROS {
                self.pool.nt_copy(at, &ZEROS);
            }
        }
        self.pool.drain(base, size);
    }

    /// Move `seg` to `state` (not free: use `release`), durably.
    pub fn transition(&self, seg: SegmentId, state: SegmentState) {
        assert!(
            state != SegmentState::Free,
            "use release() to free a segment"
        );
        let mut meta = self
            .meta(seg)
            .expect("a segment in use has a valid meta word");
        assert!(meta.state != SegmentState::Free, "{seg:?} is free");
        meta.state = state;
        self.store(seg, meta);
    }

    /// Free `seg` durably and return it to the free list. The caller has made every
    /// live entry of it durable elsewhere first.
    pub fn release(&self, seg: SegmentId) {
        self.store(seg, SegmentMeta::FREE);
        let mut free = self.free.lock();
        if self.reuse_newest_first.load(Ordering::Relaxed) {
            free.push_front(seg);
        } else {
            free.push_back(seg);
        }
    }

    /// Reuse the most recently freed segment first (see the field).
    pub fn set_reuse_newest_first(&self, on: bool) {
        self.reuse_newest_first.store(on, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowankv_pmem::PoolOptions;

    #[test]
    fn meta_words_round_trip_and_reject_garbage() {
        let m = SegmentMeta {
            state: SegmentState::Committed,
            owner: Owner::Cleaner,
            owner_index: 3,
            seq: 12345,
        };
        assert_eq!(SegmentMeta::decode(m.encode()), Ok(m));
        assert_eq!(SegmentMeta::decode(0), Ok(SegmentMeta::FREE));
        assert!(SegmentMeta::decode(7).is_err(), "state 7");
        assert!(SegmentMeta::decode(1).is_err(), "using without owner");
        assert!(SegmentMeta::decode(0x100).is_err(), "free with owner");
    }

    /// The `drpc` reserve: ordinary owners stop at `replay + headroom` free,
    /// the per-thread b-logs at `replay + CLEANING_SEGMENTS`, the cleaners and
    /// the rings' replay take the rest.
    #[test]
    fn a_reserve_holds_segments_back_by_reach() {
        let pool = Pool::anonymous(1 << 20, PoolOptions::default()).unwrap();
        let s = Segments::format(pool, 32 << 10, 0).unwrap();
        let n = s.layout().segment_count;
        assert!(n >= 20, "{n} segments");
        s.set_reserve(4, 5);
        assert_eq!(s.floors(), [9, 4 + CLEANING_SEGMENTS, 0]);
        let mut ordinary = 0;
        while s.alloc(Owner::Worker, 0).is_some() {
            ordinary += 1;
        }
        assert_eq!((ordinary, s.free_count()), (n - 9, 9));
        assert!(
            s.alloc(Owner::Control, 0).is_none(),
            "a remote log past the floor"
        );
        let mut blog = 0;
        while s.alloc(Owner::Backup, 0).is_some() {
            blog += 1;
        }
        assert_eq!(
            (blog, s.free_count()),
            (9 - 4 - CLEANING_SEGMENTS, 4 + CLEANING_SEGMENTS)
        );
        assert!(s.alloc(Owner::Cleaner, 0).is_some(), "the cleaners' part");
        let replayed = (0..)
            .take_while(|_| s.alloc_reaching(Owner::Backup, 0, Reach::Replay).is_some())
            .count();
        assert_eq!(replayed, 4 + CLEANING_SEGMENTS - 1, "replay takes the rest");
        assert_eq!(s.free_count(), 0);
        // Without a reserve nothing is held back.
        let pool = Pool::anonymous(1 << 20, PoolOptions::default()).unwrap();
        let s = Segments::format(pool, 32 << 10, 0).unwrap();
        assert_eq!(s.floors(), [0, 0, 0]);
        let all = (0..)
            .take_while(|_| s.alloc(Owner::Worker, 0).is_some())
            .count();
        assert_eq!(all, n);
    }

    #[test]
    fn format_open_alloc_release() {
        let pool = Pool::anonymous(1 << 20, PoolOptions::default()).unwrap();
        let s = Segments::format(pool.clone(), 64 << 10, 0).unwrap();
        let n = s.layout().segment_count;
        assert!(n >= 14, "{n} segments");
        let a = s.alloc(Owner::Worker, 1).unwrap();
        let b = s.alloc(Owner::Control, 0).unwrap();
        s.transition(b, SegmentState::Used);
        s.release(a);
        let (s2, in_use, corrupt) = Segments::open(pool.clone()).unwrap();
        assert!(corrupt.is_empty());
        assert_eq!(in_use.len(), 1);
        assert_eq!(in_use[0].0, b);
        assert_eq!(in_use[0].1.state, SegmentState::Used);
        assert_eq!(s2.free_count(), n - 1);
        // Allocation sequence numbers continue after the highest seen.
        let c = s2.alloc(Owner::Worker, 0).unwrap();
        assert!(s2.meta(c).unwrap().seq > in_use[0].1.seq);
    }

    #[test]
    fn a_reserved_tail_is_left_out_of_the_segments_zeroed_and_kept_on_open() {
        let pool = Pool::anonymous(1 << 20, PoolOptions::default()).unwrap();
        // An earlier life of the pool left bytes everywhere.
        pool.write(0, &vec![0xA5; 1 << 20]);
        pool.persist(0, 1 << 20);
        let s = Segments::format(pool.clone(), 64 << 10, 200 << 10).unwrap();
        let (tail, len) = s.layout().reserved_area(pool.len_bytes());
        assert!(len >= 200 << 10, "reserved {len} B");
        assert_eq!(tail + len, 1 << 20);
        assert_eq!(
            tail,
            s.layout().data_offset + s.layout().segment_count * (64 << 10)
        );
        let mut head = vec![1u8; 4096];
        pool.read(tail, &mut head);
        assert!(
            head.iter().all(|&b| b == 0),
            "the area's first 4 KiB zeroed"
        );
        let mut rest = [0u8; 8];
        pool.read(tail + 4096, &mut rest);
        assert_eq!(rest, [0xA5; 8], "past them, untouched");
        let (opened, _, _) = Segments::open(pool.clone()).unwrap();
        assert_eq!(
            opened.layout().reserved_area(pool.len_bytes()),
            (tail, len),
            "the superblock keeps the area"
        );
        let none = Segments::format(pool.clone(), 64 << 10, 0).unwrap();
        assert!(none.layout().reserved_area(pool.len_bytes()).1 < 64 << 10);
        let err = Segments::format(pool.clone(), 64 << 10, 2 << 20)
            .err()
            .unwrap();
        assert!(err.to_string().contains("does not fit"), "{err}");
    }

    #[test]
    fn bad_superblocks_are_errors() {
        let pool = Pool::anonymous(1 << 20, PoolOptions::default()).unwrap();
        assert!(matches!(
            Segments::open(pool.clone()),
            Err(EngineError::Corrupt(_))
        ));
        Segments::format(pool.clone(), 64 << 10, 0).unwrap();
        pool.write(20, &[0xFF]);
        let err = Segments::open(pool.clone()).err().unwrap();
        assert!(err.to_string().contains("checksum"), "{err}");
        let small = Pool::anonymous(64 << 10, PoolOptions::default()).unwrap();
        assert!(Segments::format(small, 64 << 10, 0).is_err());
    }
}
