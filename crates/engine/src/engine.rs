//! The engine of one server: per-shard indexes over per-thread logs, recovery and
//! cleaning (seed 000 §4.1–§4.4, §4.7, §5.3).
//!
//! Write path (a worker, `put`/`delete`): take the next version of the shard, encode
//! the entry, append it to the worker's own t-log with non-temporal stores and drain
//! (durable on return), then install it in the shard's index version-conditionally.
//! A replicated write is split in two (seed 000 §4.1): the primary appends the entry
//! it encoded, with the version it chose, to its t-log (`append_encoded`) and makes
//! it visible (`publish`) only after every backup has it. A backup's worker that
//! receives entries by RPC appends them to its per-thread b-log (`append_backup`);
//! a full b-log segment is handed back to the caller for digest. Segments for logs
//! that remote senders fill with WRITEs are allocated by `alloc_remote_segment`.
//! Read path (`get`): look up the index, read the entry from PM, verify it (checksum,
//! key) and return it; a tombstone (DEL) reads as absent.
//!
//! Cleaning (`clean`): a committed segment whose live bytes fall below the threshold
//! has its live entries (those the index still points to) copied to the cleaner's
//! log and relocated in the index by compare-and-swap, so a concurrent newer write
//! always wins; the segment is freed only after a grace period, so a reader that took
//! its address just before relocation still reads intact bytes (readers also verify
//! what they read and retry).
//!
//! Recovery (`open`): the meta table says which segments to scan; every segment that
//! is not free is parsed from its start up to a zero header; a block that does not
//! verify (a torn write, corruption) is reported and skipped, the walk resyncing at
//! the next 64 B stride; every valid entry is offered to its shard's index
//! and the newest version wins; shard version counters restart above the highest
//! version seen. A corrupt meta word or superblock is reported, never trusted. A
//! worker's, cleaner's or per-thread b-log's segment that was being filled is then
//! closed (committed) and listed in `RecoveryReport::closed_segments`.
//!
//! Failover support (promotion, re-replication, cold start): `uncommitted_entries`
//! gathers, read-only, the entries of one shard that may not be on every replica —
//! those in b-log segments (Rowan-filled or per-thread) still *using* or *used*, plus
//! segments the caller names (the closed segments of a cold start) — parsed as
//! robustly as recovery (resyncing past torn blocks and zeroed holes, assembling
//! blocks that landed apart) and returned re-encoded, one contiguous entry each,
//! sorted by version. `install_entries` installs such entries (all validated before
//! anything changes): those newer than their key's indexed version are appended to a
//! per-thread b-log and indexed; the shard's versions restart above every one seen.
//! `for_each_indexed_entry` passes every indexed entry of a shard (tombstones
//! included) to copy it to a new backup; `highest_version` is the largest version
//! seen for a shard.
//!
//! Exactly-once retries (RIFL): a write for a client request carries a request
//! record (client, seq, the client's `first_incomplete`) in its log entry
//! (`put_with_request`, `delete_with_request`, or `entry::encode_with_request` +
//! `append_encoded` + `publish_with_request`). Each shard keeps a request table
//! (`index::RequestTable`: per client, a floor and `seq → version` above it, bounded
//! by `REQUEST_CLIENTS_MAX` clients and `REQUEST_WINDOW` seqs), fed after the index
//! install on every path that indexes an entry with a record — write, publish,
//! recovery (log order), digest, `install_entries` — also for an entry that loses to
//! a newer version of its key. Copies keep the record (cleaning, assembly,
//! `uncommitted_entries`, `install_entries` at another MTU), and the cleaner copies
//! a dead entry whose outcome the table still holds. `request_outcome`
//! answers `Done(version)`, `Stale` or `Unknown`. The table is DRAM: it is rebuilt
//! from the log, so what it can forget is exactly what the log no longer holds, plus
//! its bounds — the window is in `docs/engine.md`, "Exactly-once retries".

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::{btree_map, BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rowankv_pmem::Pool;
use rowankv_types::{Clock, RequestId, RequestRecord, SegmentId, ShardId, SystemClock, Version};

use crate::entry::{self, Assembler, EntryError, Kind};
use crate::index::{RequestOutcome, RequestStats, RequestTable, ShardIndex, Upsert};
use crate::segment::{Layout, Owner, Reach, SegmentState, Segments};
use crate::EngineError;

/// The engine's sizes and thread counts, with their limits.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub segment_size_bytes: usize,
    pub mtu_bytes: usize,
    pub shard_count: u16,
    /// Worker threads (each owns a t-log). At most `WORKERS_MAX`.
    pub workers: usize,
    /// Clean threads: cleaner `c` owns the segments `s` with `s % cleaners == c` and
    /// a log of its own. At most `WORKERS_MAX`.
    pub cleaners: usize,
    /// Expected keys per shard, to size the indexes (they grow chains beyond it).
    pub keys_per_shard_expected: usize,
    /// A committed segment is cleaned when its live fraction is below this.
    pub clean_live_fraction_max: f64,
    /// Time a cleaned segment waits before it is reused (readers in flight).
    pub clean_grace: Duration,
    /// The clock the grace period is measured on (a simulator's, in simulation).
    pub clock: Arc<dyn Clock>,
    /// Reuse the most recently freed segment first, rather than the least
    /// recently freed (which spreads wear and gives readers in flight the most
    /// time). The simulator sets it so a freed segment is overwritten at once and
    /// a use of freed bytes shows.
    pub reuse_newest_first: bool,
    /// A deliberately broken engine, to show that the simulator catches it: a
    /// full t-log segment is committed at once, although entries in it may still
    /// wait for their ACKs (so the cleaner may free them). Never set outside tests.
    pub unsafe_commit_unsettled_tlog_segments: bool,
    /// Bytes at the end of the pool left out of the segments when it is
    /// formatted: the *reserved area*, for a structure the engine does not own
    /// (the redo rings of the `drpc` replication strategy). Formatting zeroes
    /// its first 4 KiB, so nothing there from an earlier life of the pool looks
    /// valid. Opening ignores this field: the layout comes from the superblock.
    pub reserved_tail_bytes: usize,
}

/// Bound on worker threads: the meta table's owner index is one byte.
pub const WORKERS_MAX: usize = 255;
/// Bound on retries of a read that raced with cleaning.
const READ_RETRIES_MAX: usize = 16;
/// Bound on the passes of [`Engine::forget_below`] over an index whose
/// entries the cleaner relocates meanwhile.
pub const FORGET_PASSES_MAX: usize = 8;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            segment_size_bytes: 4 << 20,
            mtu_bytes: entry::MTU_BYTES_DEFAULT,
            shard_count: 48,
            workers: 1,
            cleaners: 1,
            keys_per_shard_expected: 1 << 16,
            clean_live_fraction_max: 0.75,
            clean_grace: Duration::from_millis(10),
            clock: SystemClock::new(),
            reuse_newest_first: false,
            unsafe_commit_unsettled_tlog_segments: false,
            reserved_tail_bytes: 0,
        }
    }
}

impl EngineConfig {
    fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::Config(m));
        if self.workers == 0 || self.workers > WORKERS_MAX {
            return bad(format!("workers {} not in 1..={WORKERS_MAX}", self.workers));
        }
        if self.cleaners == 0 || self.cleaners > WORKERS_MAX {
            return bad(format!(
                "cleaners {} not in 1..={WORKERS_MAX}",
                self.cleaners
            ));
        }
        if self.shard_count == 0 {
            return bad("shard_count 0".into());
        }
        if self.mtu_bytes < entry::MTU_BYTES_MIN || !self.mtu_bytes.is_multiple_of(64) {
            return bad(format!("mtu {} B", self.mtu_bytes));
        }
        if self.segment_size_bytes < 2 * self.mtu_bytes {
            return bad(format!(
                "segment of {} B smaller than two MTUs",
                self.segment_size_bytes
            ));
        }
        if !(0.0..=1.0).contains(&self.clean_live_fraction_max) {
            return bad(format!("clean threshold {}", self.clean_live_fraction_max));
        }
        Ok(())
    }
}

/// What recovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments_scanned: usize,
    pub entries_indexed: u64,
    /// Entries older than the one already indexed for their key.
    pub entries_superseded: u64,
    /// Segments whose meta word was corrupt: skipped, never reused.
    pub corrupt_segments: Vec<(SegmentId, String)>,
    /// Blocks that did not verify (a torn write, corruption), reported and skipped
    /// — the first of each run: (segment, offset within it, why).
    pub skipped_blocks: Vec<(SegmentId, usize, String)>,
    /// Entries naming a shard this engine does not have.
    pub foreign_entries: u64,
    /// Multi-block entries some of whose blocks never landed (never acknowledged).
    pub incomplete_entries: usize,
    /// Segments that were being filled (*using*, owner not control) and that `open`
    /// closed (moved to *committed*), sorted. Their entries may not be on every
    /// replica: a cold start re-sends them (`Engine::uncommitted_entries`).
    pub closed_segments: Vec<SegmentId>,
}

/// What [`Engine::install_entries`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstallReport {
    /// Put and Del entries in the buffer (Commit records are not counted).
    pub entries: usize,
    /// Entries appended and now the latest of their key.
    pub installed: usize,
    /// Entries skipped (or appended but superseded in a race) because their key
    /// already had an indexed version at least theirs.
    pub already: usize,
    /// Per-thread b-log segments the appends filled and left (now *used*): hand
    /// them to the backup log's digest (`BackupLog::enqueue_used`).
    pub sealed: Vec<SegmentId>,
}

/// A live value's metadata ([`Engine::get_stored_into`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    pub version: Version,
    /// Its expiry time, Unix milliseconds (`None`: it does not expire).
    pub expires_at_ms: Option<u64>,
}

/// What ingesting one log entry or record did.
pub(crate) enum Ingested {
    Entry {
        shard: ShardId,
        version: Version,
        /// `None`: the shard is not this engine's.
        applied: Option<Upsert>,
    },
    Commit {
        shard: ShardId,
        version: Version,
    },
}

/// What a segment walk found at one place.
enum Found<'a> {
    Commit {
        shard: ShardId,
        version: Version,
    },
    /// A whole entry whose blocks lie contiguously at pool offset `addr`.
    Entry {
        addr: u64,
        entry: entry::Entry<'a>,
        /// Its encoded bytes.
        bytes: &'a [u8],
    },
    /// One block of an entry whose blocks are not contiguous here.
    Block {
        header: entry::BlockHeader,
        payload: &'a [u8],
    },
}

struct Shard {
    index: ShardIndex,
    /// The next version to hand out.
    next_version: AtomicU64,
    /// Outcomes of client requests written to the shard (exactly-once retries):
    /// fed by every path that indexes an entry with a request record; locked only
    /// for those.
    requests: Mutex<RequestTable>,
}

/// A log this engine appends to: the current segment and the write cursor.
struct Log {
    owner: Owner,
    owner_index: u8,
    segment: Option<SegmentId>,
    cursor: usize,
    scratch: Vec<u8>,
}

/// One server's store.
pub struct Engine {
    config: EngineConfig,
    pool: Arc<Pool>,
    segments: Segments,
    shards: Vec<Shard>,
    tlogs: Vec<Mutex<Log>>,
    /// Per-thread b-logs (one per worker) for replication by RPC, where a backup's
    /// worker appends what primaries send it.
    blogs: Vec<Mutex<Log>>,
    /// One log per cleaner; cleaner 0's also takes entries assembled from blocks
    /// that landed apart (digest, recovery).
    cleaner_logs: Vec<Mutex<Log>>,
    /// Live bytes per segment (entries an index points to), for cleaning.
    live_bytes: Vec<AtomicU64>,
    /// Per t-log segment: entries appended by `append_encoded` and not yet settled
    /// (published or abandoned), plus `TLOG_FILLING` while its t-log still appends
    /// to it. A full t-log segment is committed only when this reaches zero.
    unsettled: Vec<AtomicU64>,
    /// Cleaned segments waiting out the grace period.
    limbo: Mutex<VecDeque<(u64, SegmentId)>>,
    /// One cleaning pass at a time per cleaner.
    clean_locks: Vec<Mutex<()>>,
}

/// Result of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub version: Version,
    /// Pool offset of the entry.
    pub addr: u64,
}

/// What one cleaning pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanReport {
    pub segments_cleaned: usize,
    pub entries_moved: u64,
    pub bytes_moved: u64,
    pub segments_freed: usize,
    /// Dead entries copied for their request records (see `clean_segment`).
    pub records_kept: u64,
    /// Dead entries not copied because another copy already keeps their
    /// request's record.
    pub records_dropped: u64,
    /// Live PUTs past their expiry time, moved as tombstones (their values
    /// reclaimed).
    pub entries_expired: u64,
}

/// What recovery does with the log segments it closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    /// Commit them (a standalone engine).
    Commit,
    /// Leave them used for the backup log to commit (a replica).
    KeepUsed,
}

/// The bit of `Engine::unsettled` that says a t-log still appends to the segment.
const TLOG_FILLING: u64 = 1 << 63;

/// Bytes read first when reading an entry: a ZippyDB-sized entry fits.
const FIRST_READ_BYTES: usize = 256;

/// Whether `b` (from an entry's first byte) names `key`, by its unverified header:
/// a block 0 whose key length and key bytes match (the key follows the request
/// record in an entry that has one).
fn raw_key_matches(b: &[u8], key: &[u8]) -> bool {
    let Some(&format) = b.get(1) else {
        return false;
    };
    let start = entry::HEADER_BYTES + entry::record_bytes_of_format(format);
    b.len() >= start + key.len()
        && b[0] != 0
        && b[14] == 0
        && u16::from_le_bytes([b[16], b[17]]) as usize == key.len()
        && &b[start..start + key.len()] == key
}

/// The hash of `key` its shard's index files it under (xxh3).
pub fn hash_key(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

impl Engine {
    /// Format `pool` and start an empty engine.
    pub fn create(pool: Arc<Pool>, config: EngineConfig) -> Result<Engine, EngineError> {
        config.validate()?;
        let segments = Segments::format(
            pool.clone(),
            config.segment_size_bytes,
            config.reserved_tail_bytes,
        )?;
        Ok(Self::assemble(pool, config, segments))
    }

    fn assemble(pool: Arc<Pool>, config: EngineConfig, segments: Segments) -> Engine {
        segments.set_reuse_newest_first(config.reuse_newest_first);
        let log = |owner, i: usize| Log {
            owner,
            owner_index: i as u8,
            segment: None,
            cursor: 0,
            scratch: Vec::with_capacity(config.mtu_bytes),
        };
        let count = segments.layout().segment_count;
        Engine {
            shards: (0..config.shard_count)
                .map(|_| Shard {
                    index: ShardIndex::with_capacity(config.keys_per_shard_expected),
                    next_version: AtomicU64::new(1),
                    requests: Mutex::new(RequestTable::new()),
                })
                .collect(),
            tlogs: (0..config.workers)
                .map(|i| Mutex::new(log(Owner::Worker, i)))
                .collect(),
            blogs: (0..config.workers)
                .map(|i| Mutex::new(log(Owner::Backup, i)))
                .collect(),
            cleaner_logs: (0..config.cleaners)
                .map(|i| Mutex::new(log(Owner::Cleaner, i)))
                .collect(),
            live_bytes: (0..count).map(|_| AtomicU64::new(0)).collect(),
            unsettled: (0..count).map(|_| AtomicU64::new(0)).collect(),
            limbo: Mutex::new(VecDeque::new()),
            clean_locks: (0..config.cleaners).map(|_| Mutex::new(())).collect(),
            config,
            pool,
            segments,
        }
    }

    /// Open a formatted pool and recover every index from its logs, for a
    /// standalone engine: every log segment that was being filled, or waited for
    /// ACKs, is closed and committed (there is no other replica to agree with).
    pub fn open(
        pool: Arc<Pool>,
        config: EngineConfig,
    ) -> Result<(Engine, RecoveryReport), EngineError> {
        Self::open_as(pool, config, Closing::Commit)
    }

    /// Open a formatted pool of a replica (a server of a cluster) and recover
    /// every index from its logs. Segments that may hold entries some replica
    /// lacks — a log segment that was being filled, a full t-log segment that
    /// waited for ACKs, a b-log segment not yet committed — are left *used*
    /// (Rowan b-log, per-thread b-log and t-log segments alike): a cold start's
    /// gather reads them, the cleaner leaves them alone, and the backup log
    /// ([`crate::BackupLog`]) digests and commits them once their shards'
    /// CommitVer passes them, as it does any used segment. A cleaner's segment
    /// being filled is committed (it holds copies of committed entries and
    /// entries assembled from b-log blocks that are themselves still used).
    pub fn open_replica(
        pool: Arc<Pool>,
        config: EngineConfig,
    ) -> Result<(Engine, RecoveryReport), EngineError> {
        Self::open_as(pool, config, Closing::KeepUsed)
    }

    fn open_as(
        pool: Arc<Pool>,
        config: EngineConfig,
        closing: Closing,
    ) -> Result<(Engine, RecoveryReport), EngineError> {
        config.validate()?;
        let (segments, in_use, corrupt) = Segments::open(pool.clone())?;
        if segments.layout().segment_size_bytes != config.segment_size_bytes {
            return Err(EngineError::Config(format!(
                "pool has {} B segments, config says {}",
                segments.layout().segment_size_bytes,
                config.segment_size_bytes
            )));
        }
        let engine = Self::assemble(pool, config, segments);
        let mut report = RecoveryReport {
            corrupt_segments: corrupt,
            ..RecoveryReport::default()
        };
        // In allocation order, so blocks of an entry that straddle b-log segments
        // reach the assembler in the order they landed.
        let mut ordered = in_use.clone();
        ordered.sort_by_key(|(_, m)| m.seq);
        let mut assembler = Assembler::new();
        for &(seg, _) in &ordered {
            engine.recover_segment(seg, &mut assembler, &mut report)?;
        }
        report.incomplete_entries = assembler.pending();
        // Live bytes from what the indexes point to (recounted from scratch).
        for counter in &engine.live_bytes {
            counter.store(0, Ordering::Relaxed);
        }
        for shard in &engine.shards {
            shard
                .index
                .for_each(|addr| engine.account_live(addr, engine.entry_len_at(addr), true));
        }
        // A worker's or the cleaner's segment that was being filled is closed: new
        // appends go to fresh segments, so a torn tail is never appended after. So
        // is a full t-log segment whose entries were still waiting for their ACKs
        // (used): they may be on some replicas only.
        for &(seg, meta) in &in_use {
            let filling = meta.state == SegmentState::Using && meta.owner != Owner::Control;
            let unsettled = meta.state == SegmentState::Used && meta.owner == Owner::Worker;
            if filling || unsettled {
                report.closed_segments.push(seg);
            }
            let closed = match closing {
                Closing::Commit => (filling || unsettled).then_some(SegmentState::Committed),
                Closing::KeepUsed => match (meta.owner, meta.state) {
                    (Owner::Cleaner, SegmentState::Using) => Some(SegmentState::Committed),
                    (_, SegmentState::Using) => Some(SegmentState::Used),
                    _ => None,
                },
            };
            if let Some(state) = closed {
                engine.segments.transition(seg, state);
            }
        }
        report.closed_segments.sort_unstable();
        Ok((engine, report))
    }

    fn recover_segment(
        &self,
        seg: SegmentId,
        assembler: &mut Assembler,
        report: &mut RecoveryReport,
    ) -> Result<(), EngineError> {
        report.segments_scanned += 1;
        let mut sink = |e: Ingested| match e {
            Ingested::Entry {
                shard,
                version,
                applied,
            } => {
                if let Some(s) = self.shards.get(shard.0 as usize) {
                    s.next_version.fetch_max(version.0 + 1, Ordering::Relaxed);
                }
                match applied {
                    Some(Upsert::Stale { .. }) => report.entries_superseded += 1,
                    Some(_) => report.entries_indexed += 1,
                    None => report.foreign_entries += 1,
                }
            }
            Ingested::Commit { .. } => {}
        };
        for (at, why) in self.ingest_segment(seg, &|_| true, assembler, &mut sink)? {
            report.skipped_blocks.push((seg, at, why));
        }
        Ok(())
    }

    /// Walk the blocks of `seg` from its start to the end of its log, installing
    /// every entry in its shard's index (version-conditionally) and reporting each to
    /// `sink`. An entry whose blocks are contiguous is indexed where it lies; the
    /// blocks of one that landed apart (a b-log, Figure 7) go to `assembler`, and
    /// the assembled entry is written contiguously to the cleaner's log and indexed
    /// there. A zero header ends the log, except in a segment zeroed when it was
    /// allocated (a b-log's: `Owner::zeroed_on_alloc`), where zeros are only a hole
    /// (a write that never landed) and the walk goes on to the segment's end. A block
    /// that does not verify (torn or corrupt) is reported and skipped: the walk
    /// resyncs at the next 64 B stride that holds a verifying block. So is a block
    /// the assembler refuses (a duplicate, one that disagrees with its entry's
    /// earlier blocks) or an assembled entry that cannot be copied at this MTU; where
    /// the assembler dropped its oldest incomplete entries to make room, that is
    /// reported at the block that needed it. Returns the skipped places (first of
    /// each run of blocks that do not verify).
    pub(crate) fn ingest_segment(
        &self,
        seg: SegmentId,
        owns: &dyn Fn(ShardId) -> bool,
        assembler: &mut Assembler,
        sink: &mut dyn FnMut(Ingested),
    ) -> Result<Vec<(usize, String)>, EngineError> {
        let mut visit = |found: Found<'_>| -> Result<(), EngineError> {
            match found {
                Found::Commit { shard, version } => sink(Ingested::Commit { shard, version }),
                Found::Entry { addr, entry: e, .. } => {
                    let applied = self.shards.get(e.shard.0 as usize).map(|s| {
                        let r = self.install(s, e.key, addr, e.version);
                        self.note_install(addr, e.encoded_len as u64, r);
                        self.note_request(s, e.request, e.version);
                        r
                    });
                    sink(Ingested::Entry {
                        shard: e.shard,
                        version: e.version,
                        applied,
                    });
                }
                Found::Block { header, payload } => {
                    // A refused block is an `Entry` error: the walk reports it here.
                    let added = assembler.add(header, payload)?;
                    let dropped = assembler.take_dropped();
                    if let Some(e) = added {
                        let applied = match self.shards.get(e.shard.0 as usize) {
                            Some(s) => {
                                let addr = self.append_copy(
                                    0,
                                    e.kind,
                                    e.shard,
                                    e.version,
                                    &e.key,
                                    &e.value,
                                    e.request,
                                    e.expires_at_ms,
                                )?;
                                let r = self.install(s, &e.key, addr, e.version);
                                let len = e.encoded_len(self.config.mtu_bytes);
                                self.note_install(addr, len as u64, r);
                                self.note_request(s, e.request, e.version);
                                Some(r)
                            }
                            None => None,
                        };
                        sink(Ingested::Entry {
                            shard: e.shard,
                            version: e.version,
                            applied,
                        });
                    }
                    if dropped > 0 {
                        return Err(EntryError::AssemblerFull { dropped }.into());
                    }
                }
            }
            Ok(())
        };
        let zeroed = self
            .segments
            .meta(seg)
            .is_ok_and(|m| m.owner.zeroed_on_alloc());
        self.walk_segment(seg, owns, zeroed, &mut visit)
    }

    /// Walk the blocks of `seg` from its start, passing `visit` every Commit record,
    /// every entry whose blocks lie contiguously, and every other block (of an entry
    /// whose blocks landed apart), of the shards `owns` accepts, in log order. A
    /// block that does not verify is skipped, the walk resyncing at the next 64 B
    /// stride. A zero header ends the log, unless `past_zeros`: then a zero stride
    /// is skipped like a block that does not verify (a remotely filled segment may
    /// hold a hole that a WRITE still in flight at a crash never filled), and the
    /// walk goes on to the segment's end. `visit` refuses what it is given by
    /// returning an `EngineError::Entry` (e.g. a block its assembler will not take):
    /// that place is reported like a block that does not verify, and the walk goes
    /// on past it; any other error ends the walk. Returns the skipped places (first
    /// of each run of blocks that did not verify, and every refused place; zero runs
    /// are not reported).
    fn walk_segment(
        &self,
        seg: SegmentId,
        owns: &dyn Fn(ShardId) -> bool,
        past_zeros: bool,
        visit: &mut dyn FnMut(Found<'_>) -> Result<(), EngineError>,
    ) -> Result<Vec<(usize, String)>, EngineError> {
        let base = self.segments.layout().segment_offset(seg);
        let size = self.config.segment_size_bytes;
        let mut bytes = vec![0u8; size];
        self.pool.read(base, &mut bytes);
        let mut skipped = Vec::new();
        // What `visit` refuses is reported at `at`; other errors end the walk.
        fn refused(
            visited: Result<(), EngineError>,
            at: usize,
            skipped: &mut Vec<(usize, String)>,
        ) -> Result<(), EngineError> {
            match visited {
                Err(EngineError::Entry(why)) => {
                    skipped.push((at, why.to_string()));
                    Ok(())
                }
                other => other,
            }
        }
        let mut in_bad_run = false;
        let mut at = 0;
        while at < size {
            let (header, payload) = match entry::parse_block(&bytes[at..]) {
                Ok(b) => b,
                Err(EntryError::End) if !past_zeros => break,
                Err(EntryError::End) => {
                    in_bad_run = false;
                    at += entry::STRIDE_BYTES;
                    continue;
                }
                Err(err) => {
                    if !in_bad_run {
                        skipped.push((at, err.to_string()));
                    }
                    in_bad_run = true;
                    at += entry::STRIDE_BYTES;
                    continue;
                }
            };
            in_bad_run = false;
            if !owns(header.shard) {
                at += header.padded_len();
                continue;
            }
            if header.kind == Kind::Commit {
                let visited = visit(Found::Commit {
                    shard: header.shard,
                    version: header.version,
                });
                refused(visited, at, &mut skipped)?;
                at += header.padded_len();
                continue;
            }
            if header.seq == 0 {
                if let Ok(e) = entry::parse_entry(&bytes[at..]) {
                    let len = e.encoded_len;
                    let visited = visit(Found::Entry {
                        addr: (base + at) as u64,
                        bytes: &bytes[at..at + len],
                        entry: e,
                    });
                    refused(visited, at, &mut skipped)?;
                    at += len;
                    continue;
                }
            }
            // A block of an entry whose blocks are not contiguous here.
            let visited = visit(Found::Block { header, payload });
            refused(visited, at, &mut skipped)?;
            at += header.padded_len();
        }
        Ok(skipped)
    }

    /// `entry::encode` of an entry (with its request record and expiry time, if
    /// any) at this engine's MTU, into a fresh vector.
    #[allow(clippy::too_many_arguments)]
    fn encode_owned(
        &self,
        kind: Kind,
        shard: ShardId,
        version: Version,
        key: &[u8],
        value: &[u8],
        request: Option<RequestRecord>,
        expires_at_ms: Option<u64>,
    ) -> Result<Vec<u8>, EngineError> {
        let mut out = Vec::new();
        entry::encode_inner(
            &mut out,
            kind,
            shard,
            version,
            key,
            value,
            request,
            expires_at_ms,
            self.config.mtu_bytes,
        )?;
        Ok(out)
    }

    /// Encoded entries of `shard` that may not be on every replica: those in
    /// backup-log segments (owner Control or Backup) in state Using or Used, plus
    /// those in the segments listed in `extra` (whatever their state/owner; e.g.
    /// [`RecoveryReport::closed_segments`] at a cold start). Segments are walked in
    /// allocation order with one assembler, as recovery does, so a multi-block
    /// entry whose blocks landed apart or straddle segments is assembled;
    /// incomplete entries, blocks that do not verify, zeroed holes and Commit
    /// records are skipped. Reads only: nothing is indexed or written.
    ///
    /// Each returned vector is one complete entry exactly as [`entry::encode`]
    /// produces it at this engine's MTU (re-encoded from the parsed entry), so it
    /// can be appended and parsed again. Sorted by version; an entry appearing twice
    /// (same version and key) is returned once. A segment may have been reused, so
    /// older entries from its previous use may appear too: installing them is
    /// harmless, as versions decide.
    pub fn uncommitted_entries(
        &self,
        shard: ShardId,
        extra: &[SegmentId],
    ) -> Result<Vec<Vec<u8>>, EngineError> {
        let mut by_shard = self.uncommitted_entries_of(&[shard], extra)?;
        Ok(by_shard.remove(&shard).unwrap_or_default())
    }

    /// [`Engine::uncommitted_entries`] of several shards in one walk of the
    /// segments (a promotion of many shards at once): by shard, each sorted by
    /// version. Shards with no such entries are absent.
    pub fn uncommitted_entries_of(
        &self,
        shards: &[ShardId],
        extra: &[SegmentId],
    ) -> Result<BTreeMap<ShardId, Vec<Vec<u8>>>, EngineError> {
        for &shard in shards {
            self.shard(shard)?;
        }
        let count = self.segments.layout().segment_count;
        // Segment → allocation sequence number (order of allocation).
        let mut chosen: BTreeMap<SegmentId, u64> = BTreeMap::new();
        for seg in (0..count as u32).map(SegmentId) {
            if let Ok(m) = self.segments.meta(seg) {
                let blog = matches!(m.owner, Owner::Control | Owner::Backup)
                    && matches!(m.state, SegmentState::Using | SegmentState::Used);
                // A t-log segment whose entries wait for their ACKs (or did, at a
                // crash): they may be on some replicas only.
                let unsettled = m.owner == Owner::Worker && m.state == SegmentState::Used;
                if blog || unsettled {
                    chosen.insert(seg, m.seq);
                }
            }
        }
        for &seg in extra {
            if seg.0 as usize >= count {
                return Err(EngineError::Config(format!(
                    "{seg:?} out of range: the pool has {count} segments"
                )));
            }
            // A corrupt meta word says nothing of the order: walked last.
            let seq = self.segments.meta(seg).map_or(u64::MAX, |m| m.seq);
            chosen.insert(seg, seq);
        }
        let mut ordered: Vec<(u64, SegmentId)> = chosen.into_iter().map(|(s, q)| (q, s)).collect();
        ordered.sort_unstable();

        let mut found: BTreeMap<(ShardId, Version, Vec<u8>), Vec<u8>> = BTreeMap::new();
        let mut assembler = Assembler::new();
        let owns = |s: ShardId| shards.contains(&s);
        for (_, seg) in ordered {
            let mut visit = |f: Found<'_>| -> Result<(), EngineError> {
                match f {
                    Found::Commit { .. } => {}
                    Found::Entry {
                        entry: e, bytes, ..
                    } => {
                        if let btree_map::Entry::Vacant(v) =
                            found.entry((e.shard, e.version, e.key.to_vec()))
                        {
                            // Written at another MTU than ours: keep the bytes as sent.
                            let encoded = self
                                .encode_owned(
                                    e.kind,
                                    e.shard,
                                    e.version,
                                    e.key,
                                    &e.value,
                                    e.request,
                                    e.expires_at_ms,
                                )
                                .unwrap_or_else(|_| bytes.to_vec());
                            v.insert(encoded);
                        }
                    }
                    Found::Block { header, payload } => {
                        // A duplicate or disagreeing block is dropped, like one that
                        // does not verify.
                        if let Ok(Some(e)) = assembler.add(header, payload) {
                            if let btree_map::Entry::Vacant(v) =
                                found.entry((e.shard, e.version, e.key.clone()))
                            {
                                v.insert(self.encode_owned(
                                    e.kind,
                                    e.shard,
                                    e.version,
                                    &e.key,
                                    &e.value,
                                    e.request,
                                    e.expires_at_ms,
                                )?);
                            }
                        }
                    }
                }
                Ok(())
            };
            self.walk_segment(seg, &owns, true, &mut visit)?;
        }
        let mut by_shard: BTreeMap<ShardId, Vec<Vec<u8>>> = BTreeMap::new();
        for ((shard, _, _), bytes) in found {
            by_shard.entry(shard).or_default().push(bytes);
        }
        Ok(by_shard)
    }

    /// Install encoded entries (concatenated [`entry::encode`] outputs, each
    /// multi-block entry's blocks contiguous) for recovery: what a promoted primary
    /// gathered with [`Engine::uncommitted_entries`], or a shard copied with
    /// [`Engine::for_each_indexed_entry`]. Every entry must parse and verify and
    /// name a shard of this engine, else an error and nothing is changed (all are
    /// validated first). Entries whose key already has an indexed version ≥ the
    /// entry's are skipped (`already`); the rest are appended durably to
    /// per-thread b-log `worker` (as [`Engine::append_backup`] does) and indexed
    /// version-conditionally (as [`Engine::publish`] does, live bytes included).
    /// The shard's next version is raised past every entry's version. Commit records
    /// are ignored. An entry written at another MTU is re-encoded at this engine's.
    ///
    /// A per-thread b-log segment the appends filled and left is *used* and listed
    /// in [`InstallReport::sealed`] for the caller's digest. Running out of space
    /// part way is an error that leaves the entries installed so far installed
    /// (each durable before it is indexed) and any segment sealed so far *used*
    /// (recovery and `uncommitted_entries` still read it).
    pub fn install_entries(
        &self,
        worker: usize,
        encoded: &[u8],
    ) -> Result<InstallReport, EngineError> {
        let log = self
            .blogs
            .get(worker)
            .ok_or(EngineError::Config(format!("no worker {worker}")))?;
        let mtu = self.config.mtu_bytes;
        let mut valid = Vec::new();
        let mut at = 0;
        while at < encoded.len() {
            let e = entry::parse_entry(&encoded[at..])?;
            let bytes = &encoded[at..at + e.encoded_len];
            at += e.encoded_len;
            if e.kind == Kind::Commit {
                continue;
            }
            self.shard(e.shard)?;
            let len_here = entry::encoded_len_for(
                e.key.len(),
                e.value.len(),
                e.request.is_some(),
                e.expires_at_ms.is_some(),
                mtu,
            );
            let stored: Cow<'_, [u8]> = if e.encoded_len == len_here {
                Cow::Borrowed(bytes)
            } else {
                Cow::Owned(self.encode_owned(
                    e.kind,
                    e.shard,
                    e.version,
                    e.key,
                    &e.value,
                    e.request,
                    e.expires_at_ms,
                )?)
            };
            if stored.len() > self.config.segment_size_bytes {
                return Err(EngineError::Config(format!(
                    "an entry of {} B does not fit a {} B segment",
                    stored.len(),
                    self.config.segment_size_bytes
                )));
            }
            valid.push((e, stored));
        }

        let mut report = InstallReport {
            entries: valid.len(),
            ..InstallReport::default()
        };
        for (e, stored) in valid {
            let shard = self.shard(e.shard)?;
            shard
                .next_version
                .fetch_max(e.version.0 + 1, Ordering::Relaxed);
            let current = shard.index.get(hash_key(e.key), |a| self.key_at(a, e.key));
            if current.is_some_and(|a| self.version_at(a) >= e.version.0) {
                // Superseded, but the write happened: its request is answered.
                self.note_request(shard, e.request, e.version);
                report.already += 1;
                continue;
            }
            let (addr, sealed) = {
                let mut log = log.lock();
                log.scratch.clear();
                log.scratch.extend_from_slice(&stored);
                self.append_sealing(&mut log, stored.len(), None)?
            };
            report.sealed.extend(sealed);
            let upsert = self.install(shard, e.key, addr, e.version);
            self.note_install(addr, stored.len() as u64, upsert);
            self.note_request(shard, e.request, e.version);
            match upsert {
                Upsert::Stale { .. } => report.already += 1,
                _ => report.installed += 1,
            }
        }
        Ok(report)
    }

    /// Every entry of `shard` the index points to (tombstones included), as its
    /// encoded bytes (contiguous: an entry assembled from blocks that landed apart
    /// is indexed at its contiguous copy), in index order, passed to `f`; returns
    /// how many. Used to copy a shard to a new backup (re-replication), whose
    /// [`Engine::install_entries`] takes them. Weakly consistent under concurrent
    /// writes, like a scan: each key is passed once, with its entry at the moment
    /// its index item was read (cleaning that moves an entry meanwhile is followed).
    /// An entry that no longer verifies is an error.
    pub fn for_each_indexed_entry(
        &self,
        shard_id: ShardId,
        mut f: impl FnMut(&[u8]),
    ) -> Result<usize, EngineError> {
        let shard = self.shard(shard_id)?;
        let mut buf = Vec::with_capacity(FIRST_READ_BYTES);
        let mut count = 0;
        let mut failed = None;
        shard.index.for_each(|addr| {
            if failed.is_some() {
                return;
            }
            match self.read_indexed(shard_id, shard, addr, &mut buf) {
                Ok(true) => {
                    f(&buf);
                    count += 1;
                }
                Ok(false) => {}
                Err(e) => failed = Some(e),
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(count),
        }
    }

    /// Dynamic resharding (seed 000 §4.6): drop from `shard`'s index every
    /// entry whose version is below `floor` (tombstones included); their bytes
    /// are dead from then on and go with cleaning. A migration's target calls
    /// it with the source's next version before it serves the shard — entries
    /// below that are left from an earlier time this server held the shard,
    /// and may be stale — and a finished migration's source with
    /// `Version(u64::MAX)` to free the shard's index. Returns how many items
    /// it removed. The shard must take no writes meanwhile; an entry the
    /// cleaner relocates meanwhile is found at its new address by another
    /// pass (at most [`FORGET_PASSES_MAX`]). The request table forgets the
    /// outcomes of versions below `floor` too.
    pub fn forget_below(&self, shard_id: ShardId, floor: Version) -> Result<usize, EngineError> {
        let shard = self.shard(shard_id)?;
        let mut buf = Vec::with_capacity(FIRST_READ_BYTES);
        let mut removed = 0;
        for _ in 0..FORGET_PASSES_MAX {
            let mut doomed = Vec::new();
            shard.index.for_each(|addr| {
                if self.version_at(addr) < floor.0 {
                    doomed.push(addr);
                }
            });
            if doomed.is_empty() {
                // Their requests' outcomes go with them: a retry of one is
                // not answered from an entry no longer here.
                let mut table = shard.requests.lock();
                table.forget_below(floor);
                for (addr, len) in table.take_released() {
                    self.account_live(addr, len, false);
                }
                return Ok(removed);
            }
            for addr in doomed {
                if self.read_entry(addr, &mut buf).is_err() {
                    continue; // relocated and reused meanwhile: the next pass
                }
                let Ok(e) = entry::parse_entry(&buf) else {
                    continue;
                };
                if e.shard != shard_id || e.version.0 >= floor.0 {
                    continue;
                }
                let len = e.encoded_len as u64;
                if shard.index.remove_exact(hash_key(e.key), addr) {
                    self.account_live(addr, len, false);
                    removed += 1;
                }
            }
        }
        Err(EngineError::Corrupt(format!(
            "{shard_id:?}: entries below version {} still indexed after {FORGET_PASSES_MAX} passes",
            floor.0
        )))
    }

    /// Whether `key` has an entry in `shard`'s index, a tombstone or an
    /// expired value included (a GET that reads it as absent knows the key's
    /// latest write here).
    pub fn is_indexed(&self, shard_id: ShardId, key: &[u8]) -> Result<bool, EngineError> {
        let shard = self.shard(shard_id)?;
        Ok(shard
            .index
            .get(hash_key(key), |a| self.key_at(a, key))
            .is_some())
    }

    /// The outcomes `shard`'s request table holds, as records (the client's
    /// floor as `first_incomplete`) with their versions: what a migration's
    /// source hands its target ([`Engine::note_outcomes`]).
    pub fn request_outcomes(
        &self,
        shard: ShardId,
    ) -> Result<Vec<(RequestRecord, Version)>, EngineError> {
        Ok(self.shard(shard)?.requests.lock().outcomes())
    }

    /// Record outcomes of requests executed elsewhere (a migration's source)
    /// in `shard`'s request table, so a retry is answered, never executed
    /// again. Held in DRAM only: see `docs/resharding.md` for what a cold
    /// start keeps of them.
    pub fn note_outcomes(
        &self,
        shard: ShardId,
        outcomes: impl IntoIterator<Item = (RequestRecord, Version)>,
    ) -> Result<(), EngineError> {
        let mut table = self.shard(shard)?.requests.lock();
        for (r, version) in outcomes {
            table.record(&r, version);
        }
        Ok(())
    }

    /// Keys of `shard` with a live value (tombstones and expired values left out), passed to `f`,
    /// from home bucket `cursor` of its index, whole buckets at a time, until
    /// `count` keys or `budget_bytes` (a key counts `2 + its length`, what it
    /// takes in a `Keys` response): a bucket that would pass the budget is
    /// left for the next call, unless it is the call's first. Returns the next
    /// cursor, 0 once the shard is done. The index never resizes, so a key that
    /// is live for the whole scan is passed at least once; keys written or
    /// deleted meanwhile may or may not be (Redis's SCAN guarantee).
    pub fn scan_keys(
        &self,
        shard_id: ShardId,
        cursor: u64,
        count: usize,
        budget_bytes: usize,
        mut f: impl FnMut(&[u8]),
    ) -> Result<u64, EngineError> {
        let shard = self.shard(shard_id)?;
        let buckets = shard.index.bucket_count() as u64;
        let mut buf = Vec::with_capacity(FIRST_READ_BYTES);
        let (mut found, mut used) = (0usize, 0usize);
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let mut addrs = Vec::new();
        let mut home = cursor;
        while home < buckets {
            addrs.clear();
            shard.index.for_each_in(home, |a| addrs.push(a));
            keys.clear();
            for &addr in &addrs {
                if !self.read_indexed(shard_id, shard, addr, &mut buf)? {
                    continue;
                }
                let e = entry::parse_entry(&buf).map_err(EngineError::Entry)?;
                // As Redis's SCAN: an expired key is not listed.
                if e.kind == Kind::Put && !self.expired(e.expires_at_ms) {
                    keys.push(e.key.to_vec());
                }
            }
            let bytes: usize = keys.iter().map(|k| 2 + k.len()).sum();
            if home > cursor && used + bytes > budget_bytes {
                return Ok(home);
            }
            keys.iter().for_each(|k| f(k));
            found += keys.len();
            used += bytes;
            home += 1;
            if found >= count {
                break;
            }
        }
        Ok(if home >= buckets { 0 } else { home })
    }

    /// Read into `buf` the whole, verified entry of `shard` at `addr`, an index
    /// item's address; if the entry's key is now indexed elsewhere (cleaning moved
    /// it, a newer write won), read that instead. False: the key is no longer
    /// indexed.
    fn read_indexed(
        &self,
        shard_id: ShardId,
        shard: &Shard,
        mut addr: u64,
        buf: &mut Vec<u8>,
    ) -> Result<bool, EngineError> {
        for _ in 0..READ_RETRIES_MAX {
            if self.read_entry(addr, buf).is_err() {
                break;
            }
            let (len, now) = match entry::parse_entry(buf) {
                Ok(e) if e.shard == shard_id => (
                    e.encoded_len,
                    shard.index.get(hash_key(e.key), |a| self.key_at(a, e.key)),
                ),
                _ => break,
            };
            match now {
                Some(a) if a == addr => {
                    buf.truncate(len);
                    return Ok(true);
                }
                Some(a) => addr = a,
                None => return Ok(false),
            }
        }
        Err(EngineError::Corrupt(format!(
            "indexed entry of {shard_id:?} at {addr} did not verify"
        )))
    }

    /// The largest version this engine has seen for `shard` (written, published,
    /// installed or recovered), 0 if none: its next version minus one.
    pub fn highest_version(&self, shard: ShardId) -> Result<u64, EngineError> {
        Ok(self
            .shard(shard)?
            .next_version
            .load(Ordering::Relaxed)
            .saturating_sub(1))
    }

    /// Write an entry (with its request record, if any) contiguously to a
    /// cleaner's log (durable); its address.
    #[allow(clippy::too_many_arguments)]
    fn append_copy(
        &self,
        cleaner: usize,
        kind: Kind,
        shard: ShardId,
        version: Version,
        key: &[u8],
        value: &[u8],
        request: Option<RequestRecord>,
        expires_at_ms: Option<u64>,
    ) -> Result<u64, EngineError> {
        let mut log = self.cleaner_logs[cleaner].lock();
        let n = self.encode_in(
            &mut log,
            kind,
            shard,
            version,
            key,
            value,
            request,
            expires_at_ms,
        )?;
        self.append(&mut log, n)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn layout(&self) -> &Layout {
        self.segments.layout()
    }

    /// The pool's reserved area (`EngineConfig::reserved_tail_bytes`): offset
    /// and length of the bytes after the last segment, as the superblock's
    /// layout leaves them (length 0: none).
    pub fn reserved_area(&self) -> (usize, usize) {
        self.segments.layout().reserved_area(self.pool.len_bytes())
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub(crate) fn segments(&self) -> &Segments {
        &self.segments
    }

    pub fn free_segments(&self) -> usize {
        self.segments.free_count()
    }

    /// The segments of `owners` in `states`, in allocation order.
    pub fn segments_in(&self, owners: &[Owner], states: &[SegmentState]) -> Vec<SegmentId> {
        let mut found: Vec<(u64, SegmentId)> = (0..self.segments.layout().segment_count as u32)
            .map(SegmentId)
            .filter_map(|seg| {
                let m = self.segments.meta(seg).ok()?;
                (owners.contains(&m.owner) && states.contains(&m.state)).then_some((m.seq, seg))
            })
            .collect();
        found.sort_unstable();
        found.into_iter().map(|(_, s)| s).collect()
    }

    /// How many segments are in each (owner, state): what holds the pool's space.
    /// Corrupt meta words are not counted.
    pub fn segment_census(&self) -> BTreeMap<(Owner, SegmentState), usize> {
        let mut census = BTreeMap::new();
        for seg in (0..self.segments.layout().segment_count as u32).map(SegmentId) {
            if let Ok(m) = self.segments.meta(seg) {
                *census.entry((m.owner, m.state)).or_insert(0) += 1;
            }
        }
        census
    }

    fn shard(&self, shard: ShardId) -> Result<&Shard, EngineError> {
        self.shards
            .get(shard.0 as usize)
            .ok_or(EngineError::NoSuchShard(shard))
    }

    /// Read the entry at `addr` (whole, verified).
    fn read_entry(&self, addr: u64, buf: &mut Vec<u8>) -> Result<(), EntryError> {
        let addr = addr as usize;
        let seg_end = self
            .segments
            .layout()
            .segment_of(addr)
            .map(|s| self.segments.layout().segment_offset(s) + self.config.segment_size_bytes)
            .ok_or(EntryError::BadLength(format!(
                "address {addr} outside the data area"
            )))?;
        // One read covers most entries; the header (unverified until parse_entry
        // checks everything) says whether more is needed.
        let first = FIRST_READ_BYTES.min(seg_end - addr);
        buf.resize(first, 0);
        self.pool.read(addr, buf);
        let key_len = u16::from_le_bytes([buf[16], buf[17]]) as usize;
        let value_len = u32::from_le_bytes(buf[18..22].try_into().expect("4 bytes")) as usize;
        if key_len > entry::KEY_BYTES_MAX
            || value_len > entry::value_bytes_max(self.config.mtu_bytes)
        {
            return Err(EntryError::BadLength(format!(
                "entry at {addr} claims {key_len} B key, {value_len} B value"
            )));
        }
        let (has_request, has_expiry) = entry::format_flags(buf[1]).unwrap_or_default();
        let mtu = self.config.mtu_bytes;
        let len = entry::encoded_len_for(key_len, value_len, has_request, has_expiry, mtu)
            .min(seg_end - addr);
        if len > first {
            buf.resize(len, 0);
            self.pool.read(addr + first, &mut buf[first..]);
        } else {
            buf.truncate(len);
        }
        Ok(())
    }

    /// Whether the entry at `addr` is `key`'s. Index items only ever point to
    /// entries that verified when they were installed, so this compares the header's
    /// key length and the key bytes without re-checking the checksum (reads verify).
    /// One read covers the key whether or not a request record precedes it.
    fn key_at(&self, addr: u64, key: &[u8]) -> bool {
        const INLINE_KEY_BYTES: usize = 64;
        let Some(room) = self.pool.len_bytes().checked_sub(addr as usize) else {
            return false;
        };
        if room < entry::HEADER_BYTES + key.len() {
            return false;
        }
        // Far enough for the key after the longest record (request and expiry).
        let len = (entry::HEADER_BYTES + entry::RECORD_BYTES_MAX + key.len()).min(room);
        let mut inline = [0u8; entry::HEADER_BYTES + entry::RECORD_BYTES_MAX + INLINE_KEY_BYTES];
        let mut heap = Vec::new();
        let b: &mut [u8] = if len <= inline.len() {
            &mut inline[..len]
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        self.pool.read(addr as usize, b);
        raw_key_matches(b, key)
    }

    fn version_at(&self, addr: u64) -> u64 {
        let mut b = [0u8; 16];
        self.pool.read(addr as usize, &mut b);
        let mut v = [0u8; 8];
        v[..6].copy_from_slice(&b[8..14]);
        u64::from_le_bytes(v)
    }

    fn install(&self, shard: &Shard, key: &[u8], addr: u64, version: Version) -> Upsert {
        // Every version indexed here counts as seen (digest of a backup log,
        // installation of a promotion's union, recovery): a promoted primary
        // raises its next version past it, never handing out one again.
        shard
            .next_version
            .fetch_max(version.0 + 1, Ordering::Relaxed);
        shard.index.upsert(
            hash_key(key),
            addr,
            version.0,
            |a| self.key_at(a, key),
            |a| self.version_at(a),
        )
    }

    fn entry_len_at(&self, addr: u64) -> u64 {
        let mut head = [0u8; entry::HEADER_BYTES];
        self.pool.read(addr as usize, &mut head);
        let key_len = u16::from_le_bytes([head[16], head[17]]) as usize;
        let value_len = u32::from_le_bytes(head[18..22].try_into().expect("4 bytes")) as usize;
        let (has_request, has_expiry) = entry::format_flags(head[1]).unwrap_or_default();
        let mtu = self.config.mtu_bytes;
        entry::encoded_len_for(key_len, value_len, has_request, has_expiry, mtu) as u64
    }

    /// Live-byte accounting after an index update of an entry at `addr`.
    /// `len`: the new entry's encoded length, which the caller knows.
    fn note_install(&self, addr: u64, len: u64, upsert: Upsert) {
        match upsert {
            Upsert::Inserted => self.account_live(addr, len, true),
            Upsert::Replaced { old } => {
                self.account_live(old, self.entry_len_at(old), false);
                self.account_live(addr, len, true);
            }
            // A newer entry of the key is indexed: this one is dead on arrival.
            Upsert::Stale { .. } => {}
        }
    }

    /// The request table's hook: an entry of `version` with `request`'s record is
    /// indexed in `shard` (or lost to a newer version of its key). A branch and
    /// nothing else for an entry without a record. The record is taken in its
    /// logged form, so every replica's table holds the same floor.
    #[inline]
    fn note_request(&self, shard: &Shard, request: Option<RequestRecord>, version: Version) {
        if let Some(r) = request {
            let mut table = shard.requests.lock();
            table.record(&r.as_logged(), version);
            if table.has_released() {
                for (addr, len) in table.take_released() {
                    self.account_live(addr, len, false);
                }
            }
        }
    }

    /// The request record of the entry at `addr`, by its unverified block 0 (for
    /// a debug check of `publish_with_request`).
    fn request_at(&self, addr: u64) -> Option<RequestRecord> {
        let mut b = [0u8; entry::HEADER_BYTES + entry::REQUEST_RECORD_BYTES];
        if addr as usize + b.len() > self.pool.len_bytes() {
            return None;
        }
        self.pool.read(addr as usize, &mut b);
        if !entry::format_flags(b[1]).is_some_and(|(request, _)| request) {
            return None;
        }
        entry::decode_request(&b[entry::HEADER_BYTES..]).ok()
    }

    fn account_live(&self, addr: u64, len: u64, add: bool) {
        if let Some(seg) = self.segments.layout().segment_of(addr as usize) {
            let counter = &self.live_bytes[seg.0 as usize];
            if add {
                counter.fetch_add(len, Ordering::Relaxed);
            } else {
                // Saturating: a segment the cleaner already zeroed stays at zero.
                let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(len))
                });
            }
        }
    }

    /// Encode an entry (with `request`'s record, if any) into `log`'s scratch
    /// buffer; returns its length.
    #[allow(clippy::too_many_arguments)]
    fn encode_in(
        &self,
        log: &mut Log,
        kind: Kind,
        shard: ShardId,
        version: Version,
        key: &[u8],
        value: &[u8],
        request: Option<RequestRecord>,
        expires_at_ms: Option<u64>,
    ) -> Result<usize, EngineError> {
        entry::encode_inner(
            &mut log.scratch,
            kind,
            shard,
            version,
            key,
            value,
            request,
            expires_at_ms,
            self.config.mtu_bytes,
        )?;
        Ok(log.scratch.len())
    }

    /// Append encoded bytes to `log`, durably; returns the pool offset.
    fn append(&self, log: &mut Log, len: usize) -> Result<u64, EngineError> {
        self.append_sealing(log, len, None).map(|(at, _)| at)
    }

    /// As `append`; also returns the b-log segment this append filled and left (a
    /// per-thread b-log's full segment is *used*: its entries wait for digest and
    /// for CommitVer before it may be committed).
    /// `reach`: how far into the segment reserve a new segment may come from
    /// (`None`: as far as the log's owner may, [`Reach::of`]).
    fn append_sealing(
        &self,
        log: &mut Log,
        len: usize,
        reach: Option<Reach>,
    ) -> Result<(u64, Option<SegmentId>), EngineError> {
        let size = self.config.segment_size_bytes;
        let mut sealed = None;
        if log.segment.is_none() || log.cursor + len > size {
            if let Some(full) = log.segment.take() {
                match log.owner {
                    Owner::Backup => {
                        self.segments.transition(full, SegmentState::Used);
                        sealed = Some(full);
                    }
                    Owner::Worker if !self.config.unsafe_commit_unsettled_tlog_segments => {
                        self.seal_tlog_segment(full)
                    }
                    // A cleaner's copies are indexed as they are written.
                    _ => self.segments.transition(full, SegmentState::Committed),
                }
            }
            let reach = reach.unwrap_or(Reach::of(log.owner));
            let seg = self
                .segments
                .alloc_reaching(log.owner, log.owner_index, reach)
                .ok_or(EngineError::OutOfSpace)?;
            if log.owner == Owner::Worker && !self.config.unsafe_commit_unsettled_tlog_segments {
                let before = self.unsettled[seg.0 as usize].swap(TLOG_FILLING, Ordering::AcqRel);
                assert_eq!(before, 0, "{seg:?} was freed with unsettled entries");
            }
            log.segment = Some(seg);
            log.cursor = 0;
        }
        let seg = log.segment.expect("allocated above");
        let at = self.segments.layout().segment_offset(seg) + log.cursor;
        self.pool.nt_copy(at, &log.scratch[..len]);
        self.pool.drain(at, len);
        log.cursor += len;
        Ok((at as u64, sealed))
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        worker: usize,
        shard_id: ShardId,
        kind: Kind,
        key: &[u8],
        value: &[u8],
        request: Option<RequestRecord>,
        expires_at_ms: Option<u64>,
    ) -> Result<Written, EngineError> {
        let shard = self.shard(shard_id)?;
        let log = self
            .tlogs
            .get(worker)
            .ok_or(EngineError::Config(format!("no worker {worker}")))?;
        let mut log = log.lock();
        let version = Version(shard.next_version.fetch_add(1, Ordering::Relaxed));
        if version > Version::MAX {
            return Err(EngineError::VersionsExhausted(shard_id));
        }
        let len = self.encode_in(
            &mut log,
            kind,
            shard_id,
            version,
            key,
            value,
            request,
            expires_at_ms,
        )?;
        let addr = self.append(&mut log, len)?;
        drop(log);
        let upsert = self.install(shard, key, addr, version);
        self.note_install(addr, len as u64, upsert);
        self.note_request(shard, request, version);
        Ok(Written { version, addr })
    }

    /// Append an encoded entry (from [`entry::encode`], or
    /// [`entry::encode_with_request`] for a client request; version chosen by the
    /// caller) to worker `worker`'s t-log, durably, without indexing it: a primary
    /// indexes it with [`Engine::publish`] (or [`Engine::publish_with_request`],
    /// which also records the request) once every backup has it (§4.1). Until
    /// then the request table does not know the request. Returns the entry's pool
    /// offset.
    pub fn append_encoded(&self, worker: usize, encoded: &[u8]) -> Result<u64, EngineError> {
        let log = self
            .tlogs
            .get(worker)
            .ok_or(EngineError::Config(format!("no worker {worker}")))?;
        let mut log = log.lock();
        log.scratch.clear();
        log.scratch.extend_from_slice(encoded);
        let (at, _) = self.append_sealing(&mut log, encoded.len(), None)?;
        // Counted while the log is held, so the segment cannot be sealed between
        // the append and the count.
        if !self.config.unsafe_commit_unsettled_tlog_segments {
            let seg = self.segment_of(at);
            self.unsettled[seg.0 as usize].fetch_add(1, Ordering::AcqRel);
        }
        Ok(at)
    }

    /// A full t-log segment: *used* while some of its entries wait for their ACKs
    /// (the cleaner leaves it alone; recovery closes it and a cold start gathers
    /// it), *committed* once every entry is settled. Entries of a t-log segment are
    /// acknowledged only once durable on every replica (§4.2.1), so a committed one
    /// holds nothing a backup may lack.
    fn seal_tlog_segment(&self, seg: SegmentId) {
        // Used first: a settle that takes the count to zero after the filling bit
        // is cleared commits it, and must find it used.
        self.segments.transition(seg, SegmentState::Used);
        let before = self.unsettled[seg.0 as usize].fetch_and(!TLOG_FILLING, Ordering::AcqRel);
        assert!(before & TLOG_FILLING != 0, "{seg:?} sealed twice");
        if before == TLOG_FILLING {
            self.segments.transition(seg, SegmentState::Committed);
        }
    }

    /// One entry appended by `append_encoded` at `addr` is settled (published or
    /// abandoned); the last one of a sealed segment commits it.
    fn settle(&self, addr: u64) {
        if self.config.unsafe_commit_unsettled_tlog_segments {
            return;
        }
        let seg = self.segment_of(addr);
        let before = self.unsettled[seg.0 as usize].fetch_sub(1, Ordering::AcqRel);
        assert!(
            before & !TLOG_FILLING != 0,
            "{seg:?}: an entry at {addr} settled twice, or never appended by append_encoded"
        );
        if before == 1 {
            self.segments.transition(seg, SegmentState::Committed);
        }
    }

    fn segment_of(&self, addr: u64) -> SegmentId {
        self.segments
            .layout()
            .segment_of(addr as usize)
            .expect("an address this engine appended")
    }

    /// The `len` bytes [`Engine::append_encoded`] appended at `addr`, still
    /// unsettled (to replicate them again). Their segment cannot have been freed:
    /// it is not committed while they are unsettled.
    pub fn read_appended(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        let seg = self.segment_of(addr);
        assert!(
            self.config.unsafe_commit_unsettled_tlog_segments
                || self.unsettled[seg.0 as usize].load(Ordering::Acquire) & !TLOG_FILLING != 0,
            "{seg:?} holds no unsettled entry"
        );
        out.clear();
        out.resize(len, 0);
        self.pool.read(addr as usize, out);
    }

    /// The entry appended by [`Engine::append_encoded`] at `addr` will never be
    /// published (its replication failed, or this server stopped leading its
    /// shard): it no longer holds its t-log segment back from being committed. Its
    /// bytes stay where they are, unindexed.
    pub fn abandon(&self, addr: u64) {
        self.settle(addr);
    }

    /// Make the entry at `addr` (of `key`, `version`, `len` encoded bytes) visible
    /// in `shard`'s index, version-conditionally; also raises the shard's next
    /// version past `version`. Returns whether it is now the key's latest. For an
    /// entry with a request record, use [`Engine::publish_with_request`].
    pub fn publish(
        &self,
        shard_id: ShardId,
        key: &[u8],
        addr: u64,
        version: Version,
        len: usize,
    ) -> Result<bool, EngineError> {
        self.publish_with_request(shard_id, key, addr, version, len, None)
    }

    /// [`Engine::publish`] of an entry appended with its request record (bytes
    /// from [`entry::encode_with_request`]): the caller passes the record it
    /// encoded (`publish` does not read it back from PM), and the shard's request
    /// table records `request.id → version` after the index install — also when a
    /// newer version of the key wins (the write happened). `None`: as `publish`.
    /// Debug builds check that the entry at `addr` carries exactly `request`.
    pub fn publish_with_request(
        &self,
        shard_id: ShardId,
        key: &[u8],
        addr: u64,
        version: Version,
        len: usize,
        request: Option<RequestRecord>,
    ) -> Result<bool, EngineError> {
        // (Not under the planted bug, where `addr` may lie in a reused segment.)
        debug_assert!(
            self.config.unsafe_commit_unsettled_tlog_segments
                || self.request_at(addr) == request.map(|r| r.as_logged()),
            "publish of the entry at {addr} with another request record than it carries"
        );
        let shard = self.shard(shard_id)?;
        shard
            .next_version
            .fetch_max(version.0 + 1, Ordering::Relaxed);
        let upsert = self.install(shard, key, addr, version);
        self.note_install(addr, len as u64, upsert);
        self.note_request(shard, request, version);
        self.settle(addr);
        Ok(!matches!(upsert, Upsert::Stale { .. }))
    }

    /// Append encoded entries (what a primary replicated by RPC) to worker
    /// `worker`'s per-thread b-log, durably; they are indexed by digest. Returns
    /// the segment this append filled and left, if any: the caller hands it to
    /// the backup log's digest.
    pub fn append_backup(
        &self,
        worker: usize,
        encoded: &[u8],
    ) -> Result<Option<SegmentId>, EngineError> {
        self.append_backup_reaching(worker, encoded, Reach::Maintenance)
    }

    /// [`Engine::append_backup`], a new segment coming from as far into the
    /// segment reserve as `reach` ([`Engine::set_segment_reserve`]):
    /// [`Reach::Replay`] for the redo rings' replay at recovery.
    pub fn append_backup_reaching(
        &self,
        worker: usize,
        encoded: &[u8],
        reach: Reach,
    ) -> Result<Option<SegmentId>, EngineError> {
        let log = self
            .blogs
            .get(worker)
            .ok_or(EngineError::Config(format!("no worker {worker}")))?;
        let mut log = log.lock();
        log.scratch.clear();
        log.scratch.extend_from_slice(encoded);
        let (_, sealed) = self.append_sealing(&mut log, encoded.len(), Some(reach))?;
        Ok(sealed)
    }

    /// Hold free segments back for acknowledged entries that must find room
    /// later (the `drpc` strategy's redo rings): the t-logs, Rowan b-logs and
    /// remote logs leave `replay + headroom` segments free; the per-thread
    /// b-logs (under `drpc`, its redo role) may take the headroom but its last
    /// [`crate::CLEANING_SEGMENTS`], which are the cleaners', so that
    /// replication and then cleaning go on when ordinary writes are refused;
    /// only the rings' replay at recovery ([`Reach::Replay`]) takes the last
    /// `replay`. Errors if the reserve would leave ordinary allocations fewer
    /// than `headroom` segments.
    pub fn set_segment_reserve(&self, replay: usize, headroom: usize) -> Result<(), EngineError> {
        let total = self.segments.layout().segment_count;
        if (replay + 2 * headroom) > total {
            return Err(EngineError::Config(format!(
                "a reserve of {replay} + {headroom} segments leaves too few of the pool's {total} \
                 for writes: use a larger pool or larger segments"
            )));
        }
        self.segments.set_reserve(replay, headroom);
        Ok(())
    }

    /// The free segments ordinary, maintenance and cleaning allocations leave
    /// ([`Engine::set_segment_reserve`]).
    pub fn segment_floors(&self) -> [usize; 3] {
        self.segments.floors()
    }

    /// The segments per-thread b-logs are filling now (for a quiescent digest).
    pub fn backup_log_heads(&self) -> Vec<SegmentId> {
        self.blogs.iter().filter_map(|l| l.lock().segment).collect()
    }

    /// Allocate a free segment for a log a remote sender fills with one-sided
    /// WRITEs (replication by WRITE): *using*, owned by the control role like the
    /// b-log's. Returns it and its offset within the data area.
    pub fn alloc_remote_segment(&self) -> Result<(SegmentId, usize), EngineError> {
        let seg = self
            .segments
            .alloc(Owner::Control, 0)
            .ok_or(EngineError::OutOfSpace)?;
        let layout = self.segments.layout();
        Ok((seg, layout.segment_offset(seg) - layout.data_offset))
    }

    /// Store `value` under `key` in `shard`; durable on return.
    pub fn put(
        &self,
        worker: usize,
        shard: ShardId,
        key: &[u8],
        value: &[u8],
    ) -> Result<Written, EngineError> {
        self.write(worker, shard, Kind::Put, key, value, None, None)
    }

    /// Delete `key` from `shard` (a tombstone entry); durable on return.
    pub fn delete(
        &self,
        worker: usize,
        shard: ShardId,
        key: &[u8],
    ) -> Result<Written, EngineError> {
        self.write(worker, shard, Kind::Del, key, &[], None, None)
    }

    /// [`Engine::put`] for a client request: the entry carries `request`'s record
    /// (format version 2) and, once indexed, the shard's request table answers
    /// `request.id` with this write's version ([`Engine::request_outcome`]). It
    /// does not check the table: the caller asks first. A malformed record is an
    /// error and nothing is written.
    pub fn put_with_request(
        &self,
        worker: usize,
        shard: ShardId,
        key: &[u8],
        value: &[u8],
        request: RequestRecord,
    ) -> Result<Written, EngineError> {
        self.write(worker, shard, Kind::Put, key, value, Some(request), None)
    }

    /// [`Engine::put`] with an expiry time (Unix milliseconds, on the engine
    /// clock's [`rowankv_types::Clock::unix_ms`]), and `request`'s record if
    /// any: from `expires_at_ms` on the key reads as absent, and the cleaner
    /// keeps only its tombstone.
    pub fn put_expiring(
        &self,
        worker: usize,
        shard: ShardId,
        key: &[u8],
        value: &[u8],
        request: Option<RequestRecord>,
        expires_at_ms: u64,
    ) -> Result<Written, EngineError> {
        let expires = Some(expires_at_ms);
        self.write(worker, shard, Kind::Put, key, value, request, expires)
    }

    /// [`Engine::delete`] for a client request, as [`Engine::put_with_request`].
    pub fn delete_with_request(
        &self,
        worker: usize,
        shard: ShardId,
        key: &[u8],
        request: RequestRecord,
    ) -> Result<Written, EngineError> {
        self.write(worker, shard, Kind::Del, key, &[], Some(request), None)
    }

    /// What `shard` knows of client request `id` (exactly-once retries): `Done`
    /// with the version of the write's entry, `Stale` (below the client's floor:
    /// answered long ago, never execute it again) or `Unknown`. `Done` is reported
    /// only once the entry is indexed (durable on this replica, and on every
    /// replica for a published write). A write appended but not yet published is
    /// `Unknown`: the caller keeps track of requests in flight. Where a request
    /// can still be forgotten (and so execute twice): `docs/engine.md`,
    /// "Exactly-once retries".
    pub fn request_outcome(
        &self,
        shard: ShardId,
        id: RequestId,
    ) -> Result<RequestOutcome, EngineError> {
        Ok(self.shard(shard)?.requests.lock().outcome(id))
    }

    /// Counters of `shard`'s request table (sizes, evictions).
    pub fn request_stats(&self, shard: ShardId) -> Result<RequestStats, EngineError> {
        Ok(self.shard(shard)?.requests.lock().stats())
    }

    /// The latest value of `key` in `shard` and its version.
    pub fn get(
        &self,
        shard: ShardId,
        key: &[u8],
    ) -> Result<Option<(Vec<u8>, Version)>, EngineError> {
        let mut value = Vec::new();
        Ok(self
            .get_into(shard, key, &mut value)?
            .map(|version| (value, version)))
    }

    /// The latest value of `key` in `shard`, copied into `value` (cleared first);
    /// its version, or `None` if the key is absent, deleted or expired (on the
    /// engine's clock). Allocates nothing once `value` and this thread's read
    /// buffer have grown.
    pub fn get_into(
        &self,
        shard_id: ShardId,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<Option<Version>, EngineError> {
        Ok(self
            .get_stored_into(shard_id, key, value)?
            .map(|s| s.version))
    }

    /// As [`Engine::get_into`], with the value's expiry time.
    pub fn get_stored_into(
        &self,
        shard_id: ShardId,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<Option<Stored>, EngineError> {
        thread_local! {
            static READ_BUF: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(FIRST_READ_BYTES));
        }
        let shard = self.shard(shard_id)?;
        let hash = hash_key(key);
        value.clear();
        READ_BUF.with(|buf| {
            // The key check reads the whole entry, so the entry found is read once.
            let read_addr = Cell::new(0u64);
            let is_key = |a: u64| {
                let mut b = buf.borrow_mut();
                if self.read_entry(a, &mut b).is_err() {
                    return false;
                }
                read_addr.set(a);
                raw_key_matches(&b, key)
            };
            for _ in 0..READ_RETRIES_MAX {
                let Some(addr) = shard.index.get(hash, is_key) else {
                    return Ok(None);
                };
                if read_addr.get() != addr && self.read_entry(addr, &mut buf.borrow_mut()).is_err()
                {
                    continue;
                }
                let b = buf.borrow();
                match entry::parse_entry(&b) {
                    // Verified and still this key: the answer. (A cleaned-and-reused
                    // segment fails one of these checks, and the lookup is retried.)
                    Ok(e) if e.key == key && e.shard == shard_id => {
                        return Ok(match e.kind {
                            Kind::Put if !self.expired(e.expires_at_ms) => {
                                value.extend_from_slice(&e.value);
                                Some(Stored {
                                    version: e.version,
                                    expires_at_ms: e.expires_at_ms,
                                })
                            }
                            _ => None,
                        });
                    }
                    _ => continue,
                }
            }
            Err(EngineError::Corrupt(format!(
                "entry for a key of {shard_id:?} did not verify after {READ_RETRIES_MAX} reads"
            )))
        })
    }

    /// Whether an entry with expiry time `expires_at_ms` reads as absent now:
    /// once the engine clock's calendar is past that instant (as Redis: a key
    /// lives while the time is at or before its expiry).
    fn expired(&self, expires_at_ms: Option<u64>) -> bool {
        expires_at_ms.is_some_and(|t| self.config.clock.unix_ms() > t)
    }

    /// The next version `shard` will hand out.
    pub fn next_version(&self, shard: ShardId) -> Result<Version, EngineError> {
        Ok(Version(
            self.shard(shard)?.next_version.load(Ordering::Relaxed),
        ))
    }

    /// Number of keys (tombstones included) indexed in `shard`.
    pub fn indexed(&self, shard: ShardId) -> Result<usize, EngineError> {
        Ok(self.shard(shard)?.index.len())
    }

    /// One cleaning pass of every cleaner, one after another.
    pub fn clean(&self) -> Result<CleanReport, EngineError> {
        let mut total = CleanReport::default();
        for c in 0..self.config.cleaners {
            let r = self.clean_as(c)?;
            total.segments_cleaned += r.segments_cleaned;
            total.entries_moved += r.entries_moved;
            total.bytes_moved += r.bytes_moved;
            total.segments_freed += r.segments_freed;
            total.records_kept += r.records_kept;
            total.records_dropped += r.records_dropped;
            total.entries_expired += r.entries_expired;
        }
        Ok(total)
    }

    /// One pass of cleaner `cleaner` (run by its own thread): free segments whose
    /// grace period has passed, then clean every committed segment it owns whose
    /// live fraction is below the threshold.
    pub fn clean_as(&self, cleaner: usize) -> Result<CleanReport, EngineError> {
        let cleaners = self.config.cleaners;
        assert!(cleaner < cleaners, "cleaner {cleaner} of {cleaners}");
        let _one_pass = self.clean_locks[cleaner].lock();
        let mut report = CleanReport::default();
        {
            let mut limbo = self.limbo.lock();
            let now_ns = self.config.clock.now_ns();
            let grace_ns = self.config.clean_grace.as_nanos() as u64;
            while limbo
                .front()
                .is_some_and(|(t, _)| now_ns.saturating_sub(*t) >= grace_ns)
            {
                let (_, seg) = limbo.pop_front().expect("checked");
                self.segments.release(seg);
                report.segments_freed += 1;
            }
        }
        let size = self.config.segment_size_bytes as f64;
        let candidates: Vec<SegmentId> = (0..self.segments.layout().segment_count as u32)
            .map(SegmentId)
            .filter(|s| s.0 as usize % cleaners == cleaner)
            .filter(
                |&s| matches!(self.segments.meta(s), Ok(m) if m.state == SegmentState::Committed),
            )
            .filter(|&s| {
                (self.live_bytes[s.0 as usize].load(Ordering::Relaxed) as f64)
                    < self.config.clean_live_fraction_max * size
            })
            .filter(|s| !self.limbo.lock().iter().any(|(_, l)| l == s))
            .collect();
        for seg in candidates {
            self.clean_segment(cleaner, seg, &mut report)?;
        }
        Ok(report)
    }

    fn clean_segment(
        &self,
        cleaner: usize,
        seg: SegmentId,
        report: &mut CleanReport,
    ) -> Result<(), EngineError> {
        let base = self.segments.layout().segment_offset(seg);
        let size = self.config.segment_size_bytes;
        let mut bytes = vec![0u8; size];
        self.pool.read(base, &mut bytes);
        let mut at = 0;
        while at < size {
            let header = match entry::parse_block(&bytes[at..]) {
                Ok((header, _)) => header,
                Err(EntryError::End) => break,
                // Resync past what does not verify, as recovery does, so no live
                // entry behind it is freed with the segment.
                Err(_) => {
                    at += entry::STRIDE_BYTES;
                    continue;
                }
            };
            // Only an entry whose blocks lie here contiguously can be indexed here;
            // blocks that landed apart were assembled and indexed elsewhere.
            let contiguous = (header.kind != Kind::Commit && header.seq == 0)
                .then(|| entry::parse_entry(&bytes[at..]).ok())
                .flatten();
            let Some(e) = contiguous else {
                at += header.padded_len();
                continue;
            };
            let len = e.encoded_len;
            let old = (base + at) as u64;
            at += len;
            let Some(shard) = self.shards.get(e.shard.0 as usize) else {
                continue;
            };
            let hash = hash_key(e.key);
            let indexed = shard.index.get(hash, |a| self.key_at(a, e.key));
            if indexed != Some(old) {
                // Dead: a newer entry (or a newer copy) is indexed. Its request
                // record may still be the only answer to a retry of its request:
                // the table is rebuilt from the log at a restart, so while the
                // table holds the outcome, the entry is copied (not indexed) to
                // keep its record. The copy counts as live until the table
                // forgets the outcome (`RequestTable::keep`: the client's floor
                // passed it), so that a segment of such copies is not cleaned,
                // and its copies moved, at every pass. The table's lock is held
                // from the check to the keep, so no forgetting comes between.
                // One copy is kept per request: a dead entry whose record
                // another kept copy already holds (the entry was seen twice,
                // say received again by a backup) is dropped. Copying both
                // would make each the replacement of the other at every pass,
                // and leave the replaced one counted live for good.
                if let Some(r) = e.request {
                    let mut table = shard.requests.lock();
                    if table.kept_at(r.id).is_some_and(|at| at != old) {
                        report.records_dropped += 1;
                    } else if matches!(table.outcome(r.id), RequestOutcome::Done(_)) {
                        // Where a newer version of the key is indexed, only the
                        // record is kept, not the value: the copy is a
                        // value-less Del of the entry's version, which the
                        // newer one shadows here and after a restart — a few
                        // dozen bytes where the dead value may take kilobytes.
                        // A dead copy of the indexed version itself (the entry
                        // seen twice) is copied whole: a Del of that version
                        // would tie with the live entry at a restart.
                        let shadowed = indexed.is_some_and(|a| self.version_at(a) > e.version.0);
                        let (kind, value, expires) = if shadowed {
                            (Kind::Del, &[][..], None)
                        } else {
                            (e.kind, &e.value[..], e.expires_at_ms)
                        };
                        let new = self.append_copy(
                            cleaner, kind, e.shard, e.version, e.key, value, e.request, expires,
                        )?;
                        let new_len = self.entry_len_at(new);
                        self.account_live(new, new_len, true);
                        table.keep(r.id, new, new_len);
                        report.records_kept += 1;
                    } else {
                        table.unkeep(r.id, old);
                    }
                }
                continue;
            }
            // An expired value is reclaimed: only its tombstone moves, a Del of
            // the same version (and request record), which reads as the expired
            // Put does: absent. Older entries of the key stay shadowed, as by
            // any Del.
            let new = if e.kind == Kind::Put && self.expired(e.expires_at_ms) {
                report.entries_expired += 1;
                self.append_copy(
                    cleaner,
                    Kind::Del,
                    e.shard,
                    e.version,
                    e.key,
                    &[],
                    e.request,
                    None,
                )?
            } else {
                self.append_copy(
                    cleaner,
                    e.kind,
                    e.shard,
                    e.version,
                    e.key,
                    &e.value,
                    e.request,
                    e.expires_at_ms,
                )?
            };
            let new_len = self.entry_len_at(new);
            if shard.index.relocate(hash, old, new) {
                self.account_live(new, new_len, true);
                report.entries_moved += 1;
                report.bytes_moved += new_len;
            }
        }
        self.live_bytes[seg.0 as usize].store(0, Ordering::Relaxed);
        let now_ns = self.config.clock.now_ns();
        self.limbo.lock().push_back((now_ns, seg));
        report.segments_cleaned += 1;
        Ok(())
    }
}
